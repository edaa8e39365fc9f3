"""Groups and deadlines through the real service (API.md, Groups): a cancelled group's calls all
answer `cancelled` and free their workers, its session is ended, another key finds no group; a
call whose deadline passed never runs, and one still running at its deadline is stopped.

What is asserted is what the calls answer and what their sessions remember afterwards; the
durations are printed for the report, never compared with a bound.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from sandbox_service.local.redis_server import RedisServer
from tests.service.stack import Stack, stack_env
from tests.service.test_reliability import job_keys, started_job_worker

pytestmark = pytest.mark.slow

KEY = "group-test-key"
SLEEP = "import time\nprint('started', flush=True)\ntime.sleep(15)\nprint('finished')"


@pytest.fixture(scope="module")
def group_stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[tuple[Stack, Stack]]:
    """Two workers and two API replicas on one Redis, with an API key."""
    env = stack_env(redis_server.url, "groups", 64300, max_timeout=30, max_batch=64, api_key=KEY)
    first = Stack(env, logs_dir / "groups.log").start()
    second = Stack(env, logs_dir / "groups-2.log", workers=False)
    try:
        second.start()
    except BaseException:
        first.stop()
        raise
    yield first, second
    second.stop()
    first.stop()


@pytest.fixture
async def apis(group_stack: tuple[Stack, Stack]) -> AsyncIterator[tuple[Any, Any]]:
    headers = {"Authorization": f"Bearer {KEY}"}
    first, second = group_stack
    async with (
        httpx.AsyncClient(base_url=first.url, timeout=60, headers=headers) as a,
        httpx.AsyncClient(base_url=second.url, timeout=60, headers=headers) as b,
    ):
        yield a, b


async def _post(http: httpx.AsyncClient, path: str, body: Any) -> tuple[Any, float]:
    response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json(), time.perf_counter()


async def _trivial(http: httpx.AsyncClient) -> float:
    started = time.perf_counter()
    result, done = await _post(http, "/execute", {"code": "print(1)"})
    assert result["status"] == "ok" and result["stdout"] == "1\n", result
    return done - started


async def test_a_cancelled_group_answers_cancelled_and_frees_its_workers(
    apis: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    a, b = apis
    group = f"step-7/rollout:{uuid.uuid4().hex[:8]}"
    session = f"s-{uuid.uuid4().hex}"
    other_session = f"s-{uuid.uuid4().hex}"
    await _trivial(a)
    cell, _ = await _post(a, "/execute", {"code": "x = 41", "session_id": session, "group": group})
    assert cell["status"] == "ok", cell
    kept, _ = await _post(a, "/execute", {"code": "y = 1", "session_id": other_session})
    assert kept["status"] == "ok", kept

    item = {"code": SLEEP, "timeout": 25, "group": group}
    calls = [
        _post(a, "/execute/batch", {"requests": [item] * 6}),
        _post(a, "/execute", {"code": SLEEP, "timeout": 25, "group": group}),
        _post(a, "/execute", {"code": SLEEP, "timeout": 25, "group": group}),
        _post(a, "/execute", {"code": SLEEP, "timeout": 25, "session_id": session, "group": group}),
    ]
    tasks = [asyncio.ensure_future(call) for call in calls]
    await asyncio.sleep(2.0)  # both workers are running one of them, the rest wait
    assert not any(task.done() for task in tasks)

    # Cancelled through the other API replica: the group's state is in Redis.
    response = await b.post(f"/groups/{group}/cancel")
    cancel_answered = time.perf_counter()
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["group"] == group
    assert answer["cancelled"] == 9, answer
    assert answer["sessions"] == 1, answer
    # At once again, while the killed calls may still be dying: none is counted twice.
    twice = await a.post(f"/groups/{group}/cancel")
    assert twice.status_code == 200 and twice.json()["cancelled"] == 0, twice.text

    answers = await asyncio.gather(*tasks)
    results = [*answers[0][0]["results"], *(result for result, _ in answers[1:])]
    last_answer_s = max(done for _, done in answers) - cancel_answered
    assert [r["status"] for r in results] == ["cancelled"] * 9, results
    assert not any("finished" in r["stdout"] for r in results)
    killed = [r for r in results if "started" in r["stdout"]]
    assert killed and all("killed" in r["stderr"] for r in killed), killed
    never_ran = [r for r in results if r["stdout"] == ""]
    assert all("never ran" in r["stderr"] for r in never_ran), never_ran

    free_s = await _trivial(a)
    # The group's session is gone (a cell starts a new one); another session is not.
    after, _ = await _post(a, "/execute", {"code": "print(x)", "session_id": session})
    assert after["status"] == "error" and "NameError" in after["stderr"], after
    other, _ = await _post(a, "/execute", {"code": "print(y)", "session_id": other_session})
    assert other["status"] == "ok" and other["stdout"] == "1\n", other
    # Cancelling again finds nothing left to cancel; the group is still known.
    again = await b.post(f"/groups/{group}/cancel")
    assert again.status_code == 200 and again.json()["cancelled"] == 0, again.text
    print(
        f"\ngroup of 9 calls ({len(killed)} running, {len(never_ran)} queued) cancelled: all "
        f"answered {last_answer_s * 1000:.0f} ms after the cancel's answer; a trivial call then "
        f"took {free_s * 1000:.0f} ms"
    )


async def test_a_group_is_invisible_to_the_wrong_key_and_when_never_used(
    group_stack: tuple[Stack, Stack], apis: tuple[httpx.AsyncClient, httpx.AsyncClient]
) -> None:
    a, _ = apis
    unused = await a.post(f"/groups/never-used-{uuid.uuid4().hex}/cancel")
    assert unused.status_code == 404, unused.text
    bad = await a.post("/groups/has space/cancel")
    assert bad.status_code == 422 and "group" in bad.text, bad.text
    cell, _ = await _post(a, "/execute", {"code": "print(2)", "group": "mine"})
    assert cell["status"] == "ok"
    async with httpx.AsyncClient(
        base_url=group_stack[0].url, headers={"Authorization": "Bearer another-key"}
    ) as other:
        response = await other.post("/groups/mine/cancel")
    assert response.status_code == 401, response.text


async def test_a_call_past_its_deadline_never_starts(
    apis: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    a, _ = apis
    session = f"s-{uuid.uuid4().hex}"
    blockers = [
        asyncio.ensure_future(_post(a, "/execute", {"code": "import time; time.sleep(4)"}))
        for _ in range(2)
    ]
    await asyncio.sleep(1.0)  # both workers are busy for about 3 s more
    late, _ = await _post(
        a, "/execute", {"code": "x = 'ran'", "session_id": session, "deadline_s": 0.5}
    )
    await asyncio.gather(*blockers)
    assert late["status"] == "deadline_exceeded", late
    # It never ran: the session's next cell does not see what it would have defined.
    after, _ = await _post(a, "/execute", {"code": "print(x)", "session_id": session})
    assert after["status"] == "error" and "NameError" in after["stderr"], after
    print(f"\ndeadline 0.5 s passed in the queue: answered after {late['queue_time']:.2f} s")


async def test_a_call_running_at_its_deadline_is_stopped(
    apis: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    a, _ = apis
    result, _ = await _post(a, "/execute", {"code": SLEEP, "timeout": 25, "deadline_s": 2})
    assert result["status"] == "deadline_exceeded", result
    assert result["stdout"] == "started\n", result
    assert "deadline" in result["stderr"]
    bad = await a.post("/execute", json={"code": "1", "deadline_s": 0})
    assert bad.status_code == 422 and "deadline_s" in bad.text, bad.text
    print(f"\ndeadline 2 s: stopped after {result['wall_time']:.2f} s of running")


async def test_the_peer_routes_carry_a_group_in_a_header(
    apis: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    a, b = apis
    group = f"fusion-{uuid.uuid4().hex[:8]}"
    body = {"code": SLEEP, "language": "python", "run_timeout": 25}
    running = asyncio.ensure_future(
        a.post("/run_code", json=body, headers={"X-RL-Sandbox-Group": group})
    )
    await asyncio.sleep(1.5)
    cancelled = await b.post(f"/groups/{group}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["cancelled"] == 1, cancelled.text
    response = await running
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["status"] == "SandboxError" and answer["message"].startswith("cancelled"), answer
    bad = await a.post("/run_code", json=body, headers={"X-RL-Sandbox-Group": "no spaces"})
    assert bad.status_code == 422 and "x-rl-sandbox-group" in bad.text, bad.text


async def test_a_call_still_dying_is_not_counted_by_a_second_cancel(
    group_stack: tuple[Stack, Stack],
    apis: tuple[httpx.AsyncClient, httpx.AsyncClient],
    redis_client: redis.Redis,
) -> None:
    a, b = apis
    stack, _ = group_stack
    group = f"dying-{uuid.uuid4().hex[:8]}"
    before = job_keys(redis_client)
    call = asyncio.ensure_future(
        _post(a, "/execute", {"code": SLEEP, "timeout": 25, "group": group})
    )
    worker = await started_job_worker(redis_client, stack.queue, before)
    pid = int(worker.rsplit(":", 1)[1])
    # The worker can neither kill the call nor answer it while stopped: the call is dying.
    os.kill(pid, signal.SIGSTOP)
    try:
        first = await b.post(f"/groups/{group}/cancel")
        second = await b.post(f"/groups/{group}/cancel")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert first.status_code == 200 and first.json()["cancelled"] == 1, first.text
    assert second.status_code == 200 and second.json()["cancelled"] == 0, second.text
    result, _ = await call
    assert result["status"] == "cancelled" and "finished" not in result["stdout"], result
