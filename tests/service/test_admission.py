"""Admission: the bounded queue (429, nothing enqueued), the queue deadline, the API key."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from sandbox_service import keys
from sandbox_service.execution import Status
from sandbox_service.jobs import JobPayload
from sandbox_service.local.redis_server import RedisServer
from sandbox_service.settings import Settings
from sandbox_service.worker.main import JobRunner
from tests.service.stack import Stack, stack_env, wait_list_length


@pytest.fixture(scope="module")
def workerless(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    """An API whose queue no worker serves: what is admitted stays queued until its deadline."""
    env = stack_env(
        redis_server.url, "full", 62700,
        max_queue_depth=2, queue_deadline_s=3, poll_interval_s=0.3, retry_after_s=7,
    )  # fmt: skip
    stack = Stack(env, logs_dir / "full.log", workers=False).start(ready=False)
    yield stack
    stack.stop()


async def test_over_the_bound_is_429_and_nothing_is_enqueued(
    workerless: Stack, redis_client: redis.Redis
) -> None:
    async with httpx.AsyncClient(base_url=workerless.url, timeout=60) as client:
        waiting = [
            asyncio.create_task(client.post("/execute", json={"code": f"print({i})"}))
            for i in range(2)
        ]
        await wait_list_length(redis_client, keys.rq_queue(workerless.queue), 2)

        single = await client.post("/execute", json={"code": "print(3)"})
        assert single.status_code == 429
        assert single.headers["retry-after"] == "7"
        assert "queue" in single.json()["detail"]
        batch = await client.post("/execute/batch", json={"requests": [{"code": "1"}] * 2})
        assert batch.status_code == 429
        assert redis_client.llen(keys.rq_queue(workerless.queue)) == 2  # no partial batch

        # Never started: answered queue_timeout, withdrawn from the queue, never run.
        for response in await asyncio.gather(*waiting):
            assert response.status_code == 200
            result = response.json()
            assert result["status"] == "queue_timeout", result
            assert result["exit_code"] is None and result["stdout"] == ""
            assert result["queue_time"] >= 3
        assert redis_client.llen(keys.rq_queue(workerless.queue)) == 0

        metrics = (await client.get("/metrics")).text
        rejected = 'rl_sandbox_rejected_requests_total{reason="queue_full"}'
        assert f"{rejected} 2.0" in metrics
        assert 'rl_sandbox_executions_total{status="queue_timeout"} 2.0' in metrics


async def test_session_cells_waiting_on_a_workers_own_queue_count_against_the_bound(
    workerless: Stack, redis_client: redis.Redis
) -> None:
    # A worker that beats but is busy: session cells routed to it wait on its own queue.
    alive = keys.alive(workerless.queue)
    redis_client.zadd(alive, {"busy-host:1": time.time() + 3600})
    own_queue = keys.rq_queue(keys.worker_queue(workerless.queue, "busy-host:1"))
    try:
        async with httpx.AsyncClient(base_url=workerless.url, timeout=60) as client:
            cells = [
                asyncio.create_task(
                    client.post("/execute", json={"code": "x = 1", "session_id": f"s-{i}"})
                )
                for i in range(2)
            ]
            await wait_list_length(redis_client, own_queue, 2)
            assert redis_client.llen(keys.rq_queue(workerless.queue)) == 0
            metrics = (await client.get("/metrics")).text
            assert "rl_sandbox_queued_jobs 2.0" in metrics

            over = await client.post("/execute", json={"code": "print(3)"})
            assert over.status_code == 429, over.text
            another_cell = await client.post(
                "/execute", json={"code": "y = 2", "session_id": "s-new"}
            )
            assert another_cell.status_code == 429, another_cell.text
            for response in await asyncio.gather(*cells):
                assert response.json()["status"] == "queue_timeout"
    finally:
        redis_client.zrem(alive, "busy-host:1")


async def test_readyz_without_workers_is_503_with_the_reason(workerless: Stack) -> None:
    async with httpx.AsyncClient(base_url=workerless.url) as client:
        response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["detail"] == "no live worker"


def test_worker_answers_queue_timeout_without_running_late_work() -> None:
    def no_executor() -> object:
        raise AssertionError("late work must not reach the executor")

    runner = JobRunner(Settings(), no_executor)  # type: ignore[arg-type]
    now = time.time()
    payload = JobPayload(code="print(1)", admitted_at=now - 10, start_by=now - 1)
    result = runner.run("job-1", payload)
    assert result["status"] == Status.QUEUE_TIMEOUT
    assert result["queue_time"] >= 10 and result["exit_code"] is None


@pytest.fixture(scope="module")
def keyed_api(stack: Stack, logs_dir: Path) -> Iterator[Stack]:
    """A second API process with an API key, on the shared stack's queue and workers."""
    env = {**stack.env, "RL_SANDBOX_API_KEY": "s3cret-key"}
    keyed = Stack(env, logs_dir / "keyed.log", workers=False).start()
    yield keyed
    keyed.stop()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/execute"),
        ("POST", "/execute/batch"),
        ("DELETE", "/sessions/s1"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
    ],
)
async def test_api_key_is_required_everywhere_but_the_operational_paths(
    keyed_api: Stack, method: str, path: str
) -> None:
    body = {"code": "print(1)"} if path == "/execute" else {"requests": [{"code": "print(1)"}]}
    async with httpx.AsyncClient(base_url=keyed_api.url, timeout=30) as client:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"}):
            content = None if method == "DELETE" else json.dumps(body)
            response = await client.request(method, path, content=content, headers=headers)
            assert response.status_code == 401, headers
        good = {"Authorization": "Bearer s3cret-key"}
        content = None if method == "DELETE" else json.dumps(body)
        response = await client.request(method, path, content=content, headers=good)
        assert response.status_code == (404 if method == "DELETE" else 200)


async def test_probes_and_scrapers_need_no_api_key(keyed_api: Stack) -> None:
    """Kubelets and Prometheus cannot carry a secret: /healthz, /readyz, /metrics stay open."""
    async with httpx.AsyncClient(base_url=keyed_api.url, timeout=30) as client:
        assert (await client.get("/healthz")).status_code == 200
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200 and "rl_sandbox_" in metrics.text
