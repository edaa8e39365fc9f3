"""Abandoned work is cancelled (API.md): a client that goes away leaves no backlog behind.

The scenario of verl's reward tests: a client sends 100 ten-second programs with a short HTTP
timeout and gives up. The programs not started must never run, the running ones must be killed,
and the next trivial call is answered as on an idle service. What is asserted is what Redis and
the workers record (no abandoned program ran to its end; the queue emptied without running them),
never a duration; the durations are printed for the report.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from sandbox_service import keys
from sandbox_service.local.redis_server import RedisServer
from tests.service.stack import Stack, stack_env

pytestmark = pytest.mark.slow

LONG = "import time\nprint('started', flush=True)\ntime.sleep(10)\nprint('finished')"
GIVE_UP_S = 3.0
N_LONG = 100


@pytest.fixture(scope="module")
def cancel_stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    env = stack_env(
        redis_server.url,
        "cancel",
        63600,
        max_batch=128,
        max_timeout=30,
        codejudge_timeout_s=20,
    )
    running = Stack(env, logs_dir / "cancel.log").start()
    yield running
    running.stop()


def _results(client: redis.Redis, queue: str) -> list[dict[str, Any]]:
    return [
        json.loads(value)
        for key in client.scan_iter(match=keys.result(queue, "*"), count=1000)
        if (value := client.get(key)) is not None
    ]


def _bodies(route: str) -> list[tuple[str, Any]]:
    """(path, body) of the requests that carry N_LONG long programs on one route."""
    if route == "/execute/batch":
        return [(route, {"requests": [{"code": LONG, "timeout": 20}] * N_LONG})]
    if route == "/execute":
        return [(route, {"code": LONG, "timeout": 20})] * N_LONG
    if route == "/run/long-batch":
        submission = {"type": "python", "solution": LONG}
        return [(route, {"type": "batch", "submissions": [submission] * N_LONG})]
    if route == "/run_code":
        return [(route, {"code": LONG, "language": "python", "run_timeout": 20})] * N_LONG
    raise AssertionError(route)


async def _give_up(url: str, route: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=GIVE_UP_S) as client:

        async def post(path: str, body: Any) -> None:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(path, json=body)

        await asyncio.gather(*(post(path, body) for path, body in _bodies(route)))


async def _trivial_call_s(url: str) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        started = time.perf_counter()
        response = await client.post("/execute", json={"code": "print(1)"})
        elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "ok" and response.json()["stdout"] == "1\n"
    return elapsed


@pytest.mark.parametrize("route", ["/execute/batch", "/execute", "/run/long-batch", "/run_code"])
async def test_a_client_that_gives_up_leaves_no_backlog(
    cancel_stack: Stack, redis_client: redis.Redis, route: str
) -> None:
    queue = cancel_stack.queue
    for key in redis_client.scan_iter(match=keys.result(queue, "*")):
        redis_client.delete(key)
    idle_s = await _trivial_call_s(cancel_stack.url)
    redis_client.delete(*redis_client.keys(keys.result(queue, "*")) or ["-"])

    gave_up = time.perf_counter()
    await _give_up(cancel_stack.url, route)
    after_s = await _trivial_call_s(cancel_stack.url)
    since_give_up_s = time.perf_counter() - gave_up

    # Nothing of the 100 is waiting: the queue emptied by dropping them, not by running them
    # (running them would take 100 x 10 s / 2 workers).
    for _ in range(200):
        if redis_client.llen(keys.rq_queue(queue)) == 0:
            break
        await asyncio.sleep(0.05)
    assert redis_client.llen(keys.rq_queue(queue)) == 0
    await asyncio.sleep(2.0)  # any abandoned program that was running has been told to stop
    results = [r for r in _results(redis_client, queue) if r["stdout"] != "1\n"]
    finished = [r for r in results if "finished" in r["stdout"]]
    assert finished == [], "an abandoned program ran to its end"
    assert all(r["status"] == "cancelled" for r in results), results
    started = [r for r in results if "the program was killed" in r["stderr"]]
    skipped = [r for r in results if "never ran" in r["stderr"]]
    assert len(started) + len(skipped) == len(results), results
    # The killed programs were stopped early, well before their 10 s.
    assert all(r["wall_time"] < 8.0 for r in started), [r["wall_time"] for r in started]
    print(
        f"\n{route}: trivial call idle {idle_s * 1000:.0f} ms; after giving up on {N_LONG} long "
        f"programs {after_s * 1000:.0f} ms ({since_give_up_s:.2f} s after the give-up); "
        f"abandoned programs started {len(started)}, skipped at dequeue {len(skipped)}, "
        f"dropped from the queue {N_LONG - len(results)}, the started ones killed after "
        f"{[round(r['wall_time'], 2) for r in started]} s"
    )
