"""Sessions against the real service: persistent interpreters, routing, DELETE, TTL, restore."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from sandbox_service import keys
from sandbox_service.local.redis_server import RedisServer
from sandbox_service.tenancy import DEFAULT_TENANT, scoped
from tests.service.stack import Stack, stack_env
from tests.service.test_reliability import (
    FAST_DETECTION,
    job_keys,
    started_job_worker,
    wait_workers,
)


def internal(session_id: str) -> str:
    """The id the service keeps a session under: the default tenant's (no API key here)."""
    return scoped(DEFAULT_TENANT, session_id)


def new_session() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


async def cell(
    client: httpx.AsyncClient, session_id: str, code: str, **body: object
) -> dict[str, object]:
    response = await client.post("/execute", json={"code": code, "session_id": session_id, **body})
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()
    return result


def owner(client: redis.Redis, queue: str, session_id: str) -> str:
    name = client.hget(keys.session(queue, internal(session_id)), "owner")
    assert name is not None, "the session has no owner"
    return str(name.decode())


# --- the shared stack: two workers -------------------------------------------------------------


async def test_state_is_kept_across_cells_with_notebook_output(client: httpx.AsyncClient) -> None:
    sid = new_session()
    first = await cell(client, sid, "import math\nx = 40\ndef f(v):\n    return v * 2")
    assert (first["status"], first["stdout"], first["restored"]) == ("ok", "", False)
    assert (await cell(client, sid, "x + 2"))["stdout"] == "42\n"
    assert (await cell(client, sid, "f(x)"))["stdout"] == "80\n"
    assert (await cell(client, sid, "print('printed')\nNone"))["stdout"] == "printed\n"
    assert (await cell(client, sid, "y = math.factorial(5)\ny"))["stdout"] == "120\n"
    failed = await cell(client, sid, "1 / 0")
    assert failed["status"] == "error" and "ZeroDivisionError" in str(failed["stderr"])
    after = await cell(client, sid, "x, y")
    assert (after["stdout"], after["restored"]) == ("(40, 120)\n", False)


async def test_sessions_never_see_each_other(client: httpx.AsyncClient) -> None:
    a, b = new_session(), new_session()
    await cell(client, a, "secret = 'A'\nopen('mine.txt', 'w').write('A')")
    probe = "import os\nprint('secret' in globals(), os.path.exists('mine.txt'))"
    assert (await cell(client, b, probe))["stdout"] == "False False\n"
    plain = await client.post("/execute", json={"code": probe})
    assert plain.json()["stdout"] == "False False\n"
    assert (await cell(client, a, probe))["stdout"] == "True True\n"


async def test_cells_of_one_session_run_in_order(
    client: httpx.AsyncClient, stack: Stack, redis_client: redis.Redis
) -> None:
    # A batch of cells of one session: they run one after another on the session's worker.
    sid = new_session()
    batch = [{"code": "n = 0", "session_id": sid}]
    batch += [{"code": "n += 1\nn", "session_id": sid} for _ in range(5)]
    response = await client.post("/execute/batch", json={"requests": batch})
    results = response.json()["results"]
    assert [r["stdout"] for r in results] == ["", "1\n", "2\n", "3\n", "4\n", "5\n"]
    # A cell sent while the previous one still runs waits for it (the other worker is idle).
    sid = new_session()
    slow = asyncio.create_task(
        cell(client, sid, "import time\ntime.sleep(0.5)\nv = 'first'\nprint('slow done')")
    )
    for _ in range(400):
        if redis_client.exists(keys.session(stack.queue, internal(sid))):
            break  # admitted (its owner is claimed): a cell sent now is queued behind it
        await asyncio.sleep(0.01)
    follow = await cell(client, sid, "v")
    assert (await slow)["stdout"] == "slow done\n"
    assert (follow["status"], follow["stdout"]) == ("ok", "'first'\n"), follow


async def test_delete_ends_the_session_and_forgets_it(
    client: httpx.AsyncClient, stack: Stack, redis_client: redis.Redis
) -> None:
    sid = new_session()
    await cell(client, sid, "kept = 1")
    await cell(client, sid, "kept += 1")
    assert redis_client.llen(keys.session_cells(stack.queue, internal(sid))) == 2
    assert (await client.delete(f"/sessions/{sid}")).status_code == 204
    assert not redis_client.exists(keys.session(stack.queue, internal(sid)))
    assert not redis_client.exists(keys.session_cells(stack.queue, internal(sid)))
    gone = await client.delete(f"/sessions/{sid}")
    assert gone.status_code == 404 and sid in gone.json()["detail"]
    fresh = await cell(client, sid, "kept")
    assert fresh["status"] == "error" and "NameError" in str(fresh["stderr"])
    assert fresh["restored"] is False
    assert (await client.delete(f"/sessions/{new_session()}")).status_code == 404


async def test_timeout_or_crash_restarts_the_interpreter_with_a_clear_status(
    client: httpx.AsyncClient,
) -> None:
    sid = new_session()
    await cell(client, sid, "counter = 10")
    await cell(client, sid, "counter += 5")
    stuck = await cell(client, sid, "while True:\n    pass", timeout=1)
    assert stuck["status"] == "timeout"
    assert "ended the session's interpreter (timeout)" in str(stuck["stderr"])
    back = await cell(client, sid, "counter")
    assert (back["stdout"], back["restored"]) == ("15\n", True)  # replayed cells print nothing
    crash = await cell(client, sid, "import os\nos._exit(3)")
    assert (crash["status"], crash["exit_code"]) == ("error", 3)
    assert "ended the session's interpreter (error)" in str(crash["stderr"])
    again = await cell(client, sid, "counter * 2")
    assert (again["stdout"], again["restored"]) == ("30\n", True)
    steady = await cell(client, sid, "counter")
    assert (steady["stdout"], steady["restored"]) == ("15\n", False)


async def test_a_replay_its_own_cell_breaks_is_the_sessions_error_not_ours(
    client: httpx.AsyncClient,
) -> None:
    # A recorded cell that behaves otherwise when replayed (here: after a deadline) ends the
    # rebuilt interpreter: the session's own doing, so `error` with restored, never a
    # sandbox_error that a trainer would retry.
    sid = new_session()
    deadline = time.time() + 1.0
    recorded = f"import os, time\nif time.time() > {deadline}:\n    os._exit(3)\nx = 1"
    assert (await cell(client, sid, recorded))["status"] == "ok"
    crash = await cell(client, sid, "import os\nos._exit(4)")
    assert crash["status"] == "error"
    await asyncio.sleep(max(0.0, deadline - time.time()) + 0.2)
    back = await cell(client, sid, "print(x)")
    assert (back["status"], back["restored"]) == ("error", True), back
    assert "replayed" in str(back["stderr"])


# --- a stack with one live session per worker, whose worker deaths are noticed quickly ----------


@pytest.fixture(scope="module")
def small_stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    env = stack_env(
        redis_server.url, "sessions", 68000, max_sessions_per_worker=1, **FAST_DETECTION
    )
    stack = Stack(env, logs_dir / "sessions.log").start()
    yield stack
    stack.stop()


@pytest.fixture
async def small(small_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=small_stack.url, timeout=60) as http:
        yield http


async def test_evicted_sessions_are_restored(small: httpx.AsyncClient) -> None:
    # Three sessions on two workers holding one each: at least one is evicted, then restored.
    sids = [new_session() for _ in range(3)]
    for i, sid in enumerate(sids):
        await cell(small, sid, f"value = {i}\nimport random\ndraw = random.random()")
    results = [await cell(small, sid, "value") for sid in sids]
    assert [r["stdout"] for r in results] == ["0\n", "1\n", "2\n"]
    assert any(r["restored"] for r in results), results


async def test_a_session_survives_the_sigkill_of_its_worker(
    small: httpx.AsyncClient, small_stack: Stack, redis_client: redis.Redis
) -> None:
    await wait_workers(redis_client, small_stack.queue, 2)
    sid = new_session()
    await cell(small, sid, "secret = 41")
    worker = owner(redis_client, small_stack.queue, sid)
    os.kill(int(worker.rsplit(":", 1)[1]), signal.SIGKILL)
    result = await cell(small, sid, "secret + 1")
    assert (result["status"], result["stdout"], result["restored"]) == ("ok", "42\n", True)
    assert owner(redis_client, small_stack.queue, sid) != worker


async def test_a_restored_session_gets_its_cells_stdin_and_files_again(
    small: httpx.AsyncClient, small_stack: Stack, redis_client: redis.Redis
) -> None:
    await wait_workers(redis_client, small_stack.queue, 2)
    sid = new_session()
    await cell(small, sid, "who = input()", stdin="ada\n")
    await cell(
        small,
        sid,
        "size = len(open('data.csv').read())",
        files={"data.csv": base64.b64encode(b"a,b\n1,2\n").decode()},
    )
    worker = owner(redis_client, small_stack.queue, sid)
    os.kill(int(worker.rsplit(":", 1)[1]), signal.SIGKILL)
    result = await cell(small, sid, "who, size")
    assert (result["status"], result["stdout"], result["restored"]) == (
        "ok",
        "('ada', 8)\n",
        True,
    ), result


async def test_cells_running_and_queued_on_a_killed_worker_run_again_in_order(
    small: httpx.AsyncClient, small_stack: Stack, redis_client: redis.Redis
) -> None:
    await wait_workers(redis_client, small_stack.queue, 2)
    sid = new_session()
    await cell(small, sid, "base = 1")
    worker = owner(redis_client, small_stack.queue, sid)
    before = job_keys(redis_client)
    running = asyncio.create_task(cell(small, sid, "import time\ntime.sleep(2)\nbase += 1"))
    own = keys.worker_queue(small_stack.queue, worker)
    assert await started_job_worker(redis_client, own, before) == worker
    queued = asyncio.create_task(cell(small, sid, "base * 10"))
    for _ in range(400):
        if redis_client.llen(keys.rq_queue(own)):
            break
        await asyncio.sleep(0.01)
    os.kill(int(worker.rsplit(":", 1)[1]), signal.SIGKILL)
    first, second = await running, await queued
    assert (first["status"], first["restored"]) == ("ok", True), first
    assert (second["status"], second["stdout"]) == ("ok", "20\n"), second


# --- a stack whose sessions idle out after two seconds ------------------------------------------


@pytest.fixture(scope="module")
def ttl_stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    env = stack_env(redis_server.url, "session-ttl", 70000, workers=1, session_ttl_s=2)
    stack = Stack(env, logs_dir / "session-ttl.log").start()
    yield stack
    stack.stop()


async def test_idle_sessions_expire(ttl_stack: Stack, redis_client: redis.Redis) -> None:
    sid = new_session()
    async with httpx.AsyncClient(base_url=ttl_stack.url, timeout=60) as http:
        assert (await cell(http, sid, "x = 1\nx"))["stdout"] == "1\n"
        for _ in range(200):
            expired_here = f'"sessions": ["{internal(sid)}"]' in ttl_stack.log_path.read_text()
            if expired_here and not redis_client.exists(
                keys.session(ttl_stack.queue, internal(sid))
            ):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the idle session did not expire")
        assert not redis_client.exists(keys.session_cells(ttl_stack.queue, internal(sid)))
        fresh = await cell(http, sid, "x")
    assert fresh["status"] == "error" and "NameError" in str(fresh["stderr"])
    assert fresh["restored"] is False


async def test_a_busy_worker_serves_its_session_cells_and_the_shared_queue_in_turn(
    ttl_stack: Stack,
) -> None:
    # One worker: three slow cells of its session wait on its own queue when three slow
    # stateless calls arrive on the shared queue. Serving its own queue first would answer
    # every cell before any call.
    sid = new_session()
    answered: list[str] = []
    async with httpx.AsyncClient(base_url=ttl_stack.url, timeout=60) as http:
        await cell(http, sid, "import time")

        async def run(kind: str, body: dict[str, object]) -> None:
            response = await http.post("/execute", json=body)
            assert response.status_code == 200 and response.json()["status"] == "ok", response.text
            answered.append(kind)

        slow = "time.sleep(0.6)"
        cells = [
            asyncio.create_task(run("cell", {"code": slow, "session_id": sid})) for _ in range(3)
        ]
        await asyncio.sleep(0.3)  # the first cell runs, the other two wait on the own queue
        calls = [
            asyncio.create_task(run("call", {"code": f"import time\n{slow}"})) for _ in range(3)
        ]
        await asyncio.gather(*cells, *calls)
    assert sorted(answered) == ["call"] * 3 + ["cell"] * 3
    assert answered[:2] == ["cell", "call"], answered
