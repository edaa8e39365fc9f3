"""The workers' own metrics through the real stack: programs run, the counters of the workers that
ran them move in the API's /metrics; a worker outside the liveness set has no series there; the
dashboard and alert rules of deploy/monitoring/ select only metrics of the live exposition."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from sandbox_service import keys
from sandbox_service.broker.liveness import Liveness
from sandbox_service.broker.worker_stats import WorkerStats
from tests.prometheus_text import convention_problems, samples, total
from tests.service.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
POLL_S = 0.25
WAIT_S = 30.0


async def _metrics(client: httpx.AsyncClient) -> str:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return response.text


async def _until(client: httpx.AsyncClient, done: Callable[[str], bool]) -> str:
    """/metrics once `done` holds for it (workers publish with their heartbeat, every second)."""
    text = await _metrics(client)
    for _ in range(int(WAIT_S / POLL_S)):
        if done(text):
            return text
        await asyncio.sleep(POLL_S)
        text = await _metrics(client)
    return text


def _workers(text: str) -> set[str]:
    return {
        dict(labels)["worker"]
        for (name, labels), _ in samples(text).items()
        if name == "rl_sandbox_worker_start_time_seconds"
    }


async def test_the_live_workers_metrics_move_with_their_jobs(client: httpx.AsyncClient) -> None:
    before = await _until(client, lambda t: len(_workers(t)) == 2)
    assert len(_workers(before)) == 2, before
    assert convention_problems(before) == []
    ok_before = total(before, "rl_sandbox_worker_jobs_total", status="ok")
    error_before = total(before, "rl_sandbox_worker_jobs_total", status="error")
    cpu_before = total(before, "rl_sandbox_worker_jail_cpu_seconds_total")
    burn = "s = 0\nfor i in range(3_000_000): s += i\nprint(s)"
    programs = [{"code": "print(1)"}] * 3 + [{"code": burn}, {"code": "raise SystemExit(2)"}]
    results = [(await client.post("/execute", json=body)).json() for body in programs]
    assert [r["status"] for r in results] == ["ok"] * 4 + ["error"]
    session = f"metrics-{uuid.uuid4().hex}"
    cell = await client.post("/execute", json={"code": "x = 41", "session_id": session})
    assert cell.json()["status"] == "ok"

    after = await _until(
        client,
        lambda t: (
            total(t, "rl_sandbox_worker_jobs_total", status="ok") >= ok_before + 5
            and total(t, "rl_sandbox_worker_jobs_total", status="error") >= error_before + 1
            and total(t, "rl_sandbox_worker_sessions") >= 1
        ),
    )
    assert total(after, "rl_sandbox_worker_jobs_total", status="ok") >= ok_before + 5
    assert total(after, "rl_sandbox_worker_jobs_total", status="error") >= error_before + 1
    ran = sum(r["cpu_time"] for r in results)
    assert total(after, "rl_sandbox_worker_jail_cpu_seconds_total") >= cpu_before + ran * 0.99
    assert total(after, "rl_sandbox_worker_sessions") >= 1
    for worker in _workers(after):
        assert total(after, "rl_sandbox_worker_jail_starts_total", worker=worker) >= 1
    assert convention_problems(after) == []

    ended_before = total(after, "rl_sandbox_worker_sessions_ended_total", reason="deleted")
    assert (await client.delete(f"/sessions/{session}")).status_code == 204
    ended = await _until(
        client,
        lambda t: (
            total(t, "rl_sandbox_worker_sessions_ended_total", reason="deleted") > ended_before
        ),
    )
    assert total(ended, "rl_sandbox_worker_sessions_ended_total", reason="deleted") == (
        ended_before + 1
    )


async def test_only_workers_in_the_liveness_set_are_exported(
    client: httpx.AsyncClient, stack: Stack, redis_client: redis.Redis
) -> None:
    queue = stack.env["RL_SANDBOX_QUEUE_NAME"]
    liveness = Liveness(queue, dead_after_s=5.0)
    ghost = f"ghost:0:{uuid.uuid4().int % 100_000}"
    stats = WorkerStats(started_at=123.0, jobs={"ok": 7}, sessions=1)
    redis_client.set(keys.worker_stats(queue, ghost), stats.to_json(), ex=60)
    try:
        assert ghost not in _workers(await _metrics(client))  # published, but never beat
        liveness.beat(redis_client, ghost)
        text = await _metrics(client)
        assert total(text, "rl_sandbox_worker_jobs_total", worker=ghost, status="ok") == 7
        assert total(text, "rl_sandbox_worker_start_time_seconds", worker=ghost) == 123.0
        liveness.leave(redis_client, ghost)
        assert ghost not in _workers(await _metrics(client))
    finally:
        liveness.leave(redis_client, ghost)
        redis_client.delete(keys.worker_stats(queue, ghost))


async def test_the_dashboard_and_alerts_select_only_metrics_this_service_exports(
    client: httpx.AsyncClient,
) -> None:
    pytest.importorskip("promql_parser", reason="needs the `deploy` extra")
    sys.path.insert(0, str(ROOT / "deploy"))
    from deploycheck import monitoring

    live = await _until(client, lambda t: len(_workers(t)) == 2)
    exported = monitoring.exported_names(live)
    assert "rl_sandbox_worker_jobs_total" in exported
    assert monitoring.check(ROOT, known=exported) == []
