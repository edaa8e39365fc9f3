"""A batch's calls travel in chunks (several calls per queue job) through the real service: the
answers keep the request's order and each call's own output, a worker killed mid-chunk re-runs
only the calls it had not answered, and cancellation (the client leaving, a group cancelled)
reaches each call of a chunk, the running one and those waiting behind it.

A chunk's calls have the execution ids `<chunk job>.<i>` (keys.py), which is how these tests
see which calls shared a job; a call run again after its worker died gets a new, plain id.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from sandbox_service import keys
from sandbox_service.broker import jobqueue
from sandbox_service.broker.jobqueue import JobQueue, NewJob
from sandbox_service.jobs import JobPayload
from sandbox_service.local.redis_server import RedisServer
from sandbox_service.settings import Settings
from tests.service.stack import Stack, stack_env
from tests.service.test_reliability import FAST_DETECTION, job_keys, wait_workers

pytestmark = pytest.mark.slow

SLEEP = "import time\nprint('started', flush=True)\ntime.sleep(15)\nprint('finished')"


@pytest.fixture(scope="module")
def chunk_stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    """Two workers (a batch of 8 travels in 4 chunks of 2), whose deaths are noticed quickly."""
    env = stack_env(
        redis_server.url, "chunks", 64700, max_batch=64, max_timeout=30, **FAST_DETECTION
    )
    running = Stack(env, logs_dir / "chunks.log").start()
    yield running
    running.stop()


def chunk_of(result: dict[str, Any]) -> str | None:
    """The chunk job a call travelled in, or None for a call that was a job of its own."""
    job, sep, _ = str(result["id"]).partition(".")
    return job if sep else None


def stored_results(client: redis.Redis, queue: str) -> dict[str, dict[str, Any]]:
    """Every result stored in this queue's keys, by execution id."""
    prefix = keys.result(queue, "")
    return {
        key.decode()[len(prefix) :]: json.loads(value)
        for key in client.scan_iter(match=keys.result(queue, "*"), count=1000)
        if (value := client.get(key)) is not None
    }


async def test_a_batch_larger_than_the_workers_answers_in_order_from_few_jobs(
    chunk_stack: Stack, redis_client: redis.Redis
) -> None:
    await wait_workers(redis_client, chunk_stack.queue, 2)
    await asyncio.sleep(1.1)  # the API's count of live workers is at most a second old
    # Earlier calls sleep longer; every call prints its own index.
    code = "import time; time.sleep({}); print({})"
    requests = [{"code": code.format((15 - i) * 0.01, i)} for i in range(16)]
    async with httpx.AsyncClient(base_url=chunk_stack.url, timeout=60) as http:
        response = await http.post("/execute/batch", json={"requests": requests})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [(r["status"], r["stdout"]) for r in results] == [("ok", f"{i}\n") for i in range(16)]
    chunks = [chunk_of(r) for r in results]
    assert None not in chunks, chunks
    assert len(set(chunks)) == 4, chunks  # two per live worker, not sixteen jobs
    assert len({r["id"] for r in results}) == 16


CPP_ECHO = "#include <iostream>\nint main() { std::string s; std::cin >> s; std::cout << s; }\n"


async def test_cpp_calls_in_a_chunk_compile_and_run_each_with_its_own_input(
    chunk_stack: Stack, redis_client: redis.Redis
) -> None:
    await wait_workers(redis_client, chunk_stack.queue, 2)
    await asyncio.sleep(1.1)  # the API's count of live workers is at most a second old
    # Even calls are C++ reading their stdin, odd ones Python: 4 chunks of 2, each mixed.
    requests = [
        {"code": CPP_ECHO, "language": "cpp", "stdin": f"cpp{i}"}
        if i % 2 == 0
        else {"code": f"print({i})"}
        for i in range(8)
    ]
    async with httpx.AsyncClient(base_url=chunk_stack.url, timeout=120) as http:
        response = await http.post("/execute/batch", json={"requests": requests})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    expected = [f"cpp{i}" if i % 2 == 0 else f"{i}\n" for i in range(8)]
    assert [(r["status"], r["stdout"]) for r in results] == [("ok", out) for out in expected]
    assert all(chunk_of(r) is not None for r in results), results
    assert all(r["compile"]["status"] == "ok" for r in results[::2]), results
    assert all(r["compile"] is None for r in results[1::2]), results


async def test_a_worker_killed_mid_chunk_leaves_every_call_answered_with_its_own_output(
    chunk_stack: Stack, redis_client: redis.Redis
) -> None:
    queue = chunk_stack.queue
    await wait_workers(redis_client, queue, 2)
    code = "import time; time.sleep(0.4); print({})"
    requests = [{"code": code.format(i)} for i in range(16)]  # 4 chunks of 4
    async with httpx.AsyncClient(base_url=chunk_stack.url, timeout=120) as http:
        before = job_keys(redis_client)
        request = asyncio.create_task(http.post("/execute/batch", json={"requests": requests}))
        victim, chunk = await _chunk_with_a_delivered_call(redis_client, queue, before)
        os.kill(int(victim.rsplit(":", 1)[1]), signal.SIGKILL)
        response = await request
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [(r["status"], r["stdout"]) for r in results] == [("ok", f"{i}\n") for i in range(16)]
    # The call answered before the kill kept its answer; only the others of its chunk ran again.
    ids = [r["id"] for r in results]
    assert f"{chunk}.0" in ids, ids
    rerun = [i for i in ids if chunk_of({"id": i}) is None]
    assert 1 <= len(rerun) <= 3, ids


async def _chunk_with_a_delivered_call(
    client: redis.Redis, queue: str, before: set[bytes]
) -> tuple[str, str]:
    """(worker, chunk job) of a started chunk created after `before` whose first call is
    answered and whose last is not."""
    for _ in range(400):
        for key in job_keys(client) - before:
            origin, status, worker = client.hmget(key, "origin", "status", "worker_name")
            if origin != queue.encode() or status != b"started" or not worker:
                continue
            chunk = key.decode().removeprefix("rq:job:")
            first, last = (client.exists(keys.result(queue, f"{chunk}.{i}")) for i in (0, 3))
            if first and not last:
                return worker.decode(), chunk
        await asyncio.sleep(0.02)
    raise AssertionError("no chunk with a delivered call")


async def test_a_client_that_leaves_mid_batch_cancels_the_calls_waiting_in_its_chunks(
    chunk_stack: Stack, redis_client: redis.Redis
) -> None:
    queue = chunk_stack.queue
    await wait_workers(redis_client, queue, 2)
    seen = set(stored_results(redis_client, queue))
    async with httpx.AsyncClient(base_url=chunk_stack.url, timeout=3.0) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/execute/batch", json={"requests": [{"code": SLEEP}] * 8})
    # The workers are free again: a trivial call is answered (before 15 s programs could end).
    async with httpx.AsyncClient(base_url=chunk_stack.url, timeout=60) as http:
        response = await http.post("/execute", json={"code": "print(1)", "timeout": 1})
    assert response.json()["stdout"] == "1\n", response.text
    results = {
        k: v
        for k, v in stored_results(redis_client, queue).items()
        if k not in seen and chunk_of({"id": k})  # the trivial call was a job of its own
    }
    # The two running chunks answered their running call killed and the one behind it
    # never ran; the two waiting chunks were taken off the queue without a result.
    by_state = sorted(
        ("killed" if "started" in r["stdout"] else "never ran", r["status"])
        for r in results.values()
    )
    assert by_state == [("killed", "cancelled")] * 2 + [("never ran", "cancelled")] * 2, results
    assert not any("finished" in r["stdout"] for r in results.values())


async def test_a_group_cancel_reaches_the_calls_of_its_group_inside_chunks(
    chunk_stack: Stack,
) -> None:
    group = f"rollout-{uuid.uuid4().hex[:8]}"
    # Even calls in the group (each runs 15 s), odd ones not (each prints its index).
    requests: list[dict[str, Any]] = [
        {"code": SLEEP, "timeout": 25, "group": group} if i % 2 == 0 else {"code": f"print({i})"}
        for i in range(8)
    ]
    async with httpx.AsyncClient(base_url=chunk_stack.url, timeout=60) as http:
        batch = asyncio.create_task(http.post("/execute/batch", json={"requests": requests}))
        await asyncio.sleep(2.0)  # each worker runs the first call of a chunk of the group
        response = await http.post(f"/groups/{group}/cancel")
        assert response.status_code == 200, response.text
        answered = await batch
    assert answered.status_code == 200, answered.text
    results = answered.json()["results"]
    assert response.json()["cancelled"] == 4, response.json()
    for i, result in enumerate(results):
        if i % 2:
            assert (result["status"], result["stdout"]) == ("ok", f"{i}\n"), result
        else:
            assert result["status"] == "cancelled", result
            assert "finished" not in result["stdout"]
            assert ("killed" if "started" in result["stdout"] else "never ran") in result["stderr"]
    assert any("never ran" in r["stderr"] for r in results[::2]), results


async def test_deadlines_stay_per_call_inside_a_chunk(chunk_stack: Stack) -> None:
    # Calls 0 and 1 share a chunk and a 1.5 s deadline: 0 runs into it, 1 starts past it.
    late = {"code": "import time; time.sleep(5)", "deadline_s": 1.5, "timeout": 10}
    requests = [late, {"code": "print(1)", "deadline_s": 1.5}]
    requests += [{"code": f"print({i})"} for i in range(2, 8)]
    async with httpx.AsyncClient(base_url=chunk_stack.url, timeout=60) as http:
        response = await http.post("/execute/batch", json={"requests": requests})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert chunk_of(results[0]) == chunk_of(results[1]) is not None, results
    assert [r["status"] for r in results[:2]] == ["deadline_exceeded"] * 2, results
    assert "never ran" in results[1]["stderr"], results[1]
    assert [(r["status"], r["stdout"]) for r in results[2:]] == [
        ("ok", f"{i}\n") for i in range(2, 8)
    ]


def test_a_waiting_chunk_counts_each_of_its_calls_against_the_bound(
    redis_client: redis.Redis,
) -> None:
    # No workers on this queue: what is admitted waits. A bound of 6 calls.
    queue = JobQueue(redis_client, f"chunk-bound-{uuid.uuid4().hex[:8]}", result_ttl_s=60)
    settings = Settings(redis_url="redis://unused")
    five = NewJob.chunk("c5", [JobPayload(code=f"print({i})") for i in range(5)], settings)
    two = NewJob.chunk("c2", [JobPayload(code="1"), JobPayload(code="2")], settings)
    one = NewJob.of("j1", JobPayload(code="1"), settings)

    def admit(*groups: list[NewJob]) -> list[int]:
        script_keys, argv = queue.admission(groups, 6)
        return list(redis_client.eval(jobqueue.ADMIT_SCRIPT, len(script_keys), *script_keys, *argv))

    assert admit([five], [two], [one]) == [1, 0, 1]
    script_keys, _ = queue.admission([], 6)
    depth = redis_client.eval(jobqueue.DEPTH_SCRIPT, 2, *script_keys)
    assert depth == 6
    assert queue.withdraw(["c5.3"]) == [True]  # a call withdraws its whole chunk
    assert redis_client.eval(jobqueue.DEPTH_SCRIPT, 2, *script_keys) == 1


def test_a_tenants_waiting_chunk_counts_each_call_in_its_share_and_in_flight(
    redis_client: redis.Redis,
) -> None:
    # No workers: what is admitted waits on the tenant's queue, whose share is 6 calls, with
    # at most 7 calls in flight; the queue's own bound (100) is not what refuses.
    name = f"chunk-tenant-{uuid.uuid4().hex[:8]}"
    queue = JobQueue(redis_client, name, result_ttl_s=60)
    settings = Settings(redis_url="redis://unused")
    tenant_queue = keys.tenant_queue(name, "alpha")
    bounds = jobqueue.GroupBounds(
        tenant_queue=tenant_queue,
        queue_share=6,
        in_flight_key=keys.in_flight(name, "alpha"),
        max_in_flight=7,
        expires_at=time.time() + 60,
    )

    def chunk(chunk_id: str, calls: int) -> NewJob:
        job = NewJob.chunk(chunk_id, [JobPayload(code=str(i)) for i in range(calls)], settings)
        return dataclasses.replace(job, queue=tenant_queue)

    def admit(*groups: list[NewJob]) -> list[int]:
        script_keys, argv = queue.admission(groups, 100, [bounds] * len(groups), [tenant_queue])
        return list(redis_client.eval(jobqueue.ADMIT_SCRIPT, len(script_keys), *script_keys, *argv))

    assert admit([chunk("c5", 5)], [chunk("c2", 2)]) == [
        jobqueue.ADMITTED,
        jobqueue.TENANT_QUEUE_FULL,  # 5 + 2 calls > the share of 6 (2 jobs would fit)
    ]
    assert redis_client.llen(keys.rq_queue(tenant_queue)) == 1  # one job for five calls
    in_flight = {m.decode() for m in redis_client.zrange(keys.in_flight(name, "alpha"), 0, -1)}
    assert in_flight == {f"c5.{i}" for i in range(5)}
    script_keys, _ = queue.admission([], 100, [], [tenant_queue])
    assert redis_client.eval(jobqueue.DEPTH_SCRIPT, len(script_keys), *script_keys) == 5
    # The share is free again once the chunk is withdrawn; the in-flight calls still count.
    assert queue.withdraw(["c5.0"], [tenant_queue]) == [True]
    assert redis_client.eval(jobqueue.DEPTH_SCRIPT, len(script_keys), *script_keys) == 0
    assert admit([chunk("c3", 3)]) == [jobqueue.IN_FLIGHT_QUOTA]  # 5 + 3 > 7 in flight
    assert admit([chunk("c2b", 2)]) == [jobqueue.ADMITTED]
