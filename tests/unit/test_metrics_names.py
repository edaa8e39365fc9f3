"""/metrics keeps Prometheus' naming conventions, read back with prometheus_client's parser; the
workers' stats survive their Redis encoding and a malformed record is ignored."""

from __future__ import annotations

import pytest

from sandbox_service.api.metrics import Metrics
from sandbox_service.broker.worker_stats import MAX_STATS_BYTES, WorkerStats
from tests.prometheus_text import convention_problems, families, total

STATS = WorkerStats(
    started_at=1_700_000_000.0,
    jobs={"ok": 5, "error": 1},
    jail_cpu_seconds=0.25,
    jail_starts=2,
    jail_failures=1,
    jail_recycles={"memory": 0, "max_runs": 1},
    jail_throttled_seconds=0.5,
    jail_memory_above_baseline_bytes=4096.0,
    sessions=2,
    session_restores=1,
    sessions_ended={"deleted": 3, "evicted": 1, "expired": 0},
)


def _metrics() -> Metrics:
    metrics = Metrics()
    metrics.observe_result({"status": "ok", "queue_time": 0.01, "wall_time": 0.002}, "default")  # type: ignore[typeddict-item]
    metrics.respond("/execute", 200, "default")
    metrics.respond("/execute", 401, "")
    metrics.observe_result({"status": "error", "queue_time": 0.01, "wall_time": 0.1}, "other")  # type: ignore[typeddict-item]
    metrics.reject("queue_full", "default")
    metrics.request_duration.labels("/execute").observe(0.01)
    metrics.scraped.lost_job_retries = 2
    metrics.scraped.workers = {"host:0:10": STATS, "host:1:11": WorkerStats(started_at=1.0)}
    return metrics


def _exposition() -> str:
    return _metrics().render().decode()


def test_every_family_keeps_the_naming_conventions() -> None:
    assert convention_problems(_exposition()) == []


def test_counters_are_exposed_with_total() -> None:
    text = _exposition()
    counters = {name for name, family in families(text).items() if family.type == "counter"}
    assert {"rl_sandbox_executions", "rl_sandbox_lost_job_retries", "rl_sandbox_worker_jobs"} <= (
        counters
    )
    assert "rl_sandbox_lost_job_retries_total 2.0" in text
    assert "_created" not in text


def test_worker_series_carry_the_worker_label() -> None:
    text = _exposition()
    assert total(text, "rl_sandbox_worker_jobs_total", worker="host:0:10") == 6
    assert total(text, "rl_sandbox_worker_jobs_total", status="ok") == 5
    assert total(text, "rl_sandbox_worker_sessions", worker="host:0:10") == 2
    assert total(text, "rl_sandbox_worker_jail_recycles_total", reason="max_runs") == 1
    assert total(text, "rl_sandbox_worker_start_time_seconds", worker="host:1:11") == 1.0
    worker_families = [f for n, f in families(text).items() if n.startswith("rl_sandbox_worker_")]
    for family in worker_families:
        assert all("worker" in sample.labels for sample in family.samples), family.name


def _one(name: str, kind: str, sample: str, doc: bool = True) -> str:
    return (f"# HELP {name} some help\n" if doc else "") + f"# TYPE {name} {kind}\n{sample} 1\n"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (_one("rl_sandbox_x_ms", "gauge", "rl_sandbox_x_ms"), "base units"),
        (_one("rl_sandbox_c", "counter", "rl_sandbox_c"), "counter without _total"),
        (_one("rl_sandbox_g_total", "gauge", "rl_sandbox_g_total"), "like a counter"),
        (_one("rl_sandbox_h", "histogram", "rl_sandbox_h_count", doc=False), "no HELP"),
        (_one("rl_sandbox_latency", "histogram", "rl_sandbox_latency_count"), "unit as the suffix"),
        (_one("other", "gauge", "other"), "not under"),
    ],
)
def test_the_checker_sees_each_broken_convention(text: str, problem: str) -> None:
    assert any(problem in p for p in convention_problems(text)), convention_problems(text)


def test_worker_stats_round_trip_their_encoding() -> None:
    assert WorkerStats.from_json(STATS.to_json()) == STATS


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "{}",
        '{"started_at": "x"}',
        STATS.to_json().replace('"sessions":2', '"sessions":true'),
        STATS.to_json().replace('"jail_cpu_seconds":0.25', '"jail_cpu_seconds":NaN'),
        "[" * (MAX_STATS_BYTES + 1),
    ],
)
def test_a_malformed_record_is_ignored(text: str) -> None:
    assert WorkerStats.from_json(text) is None


def test_the_open_exposition_names_no_tenant_and_the_keyed_one_one_or_all() -> None:
    metrics = _metrics()
    text = metrics.render().decode()
    assert "tenant" not in text and "default" not in text and "other" not in text
    assert total(text, "rl_sandbox_executions_total", status="ok") == 1
    everyone = metrics.tenants.render(None).decode()
    other = metrics.tenants.render("other").decode()
    assert convention_problems(everyone) == []
    assert total(everyone, "rl_sandbox_tenant_executions_total", tenant="default") == 1
    assert total(everyone, "rl_sandbox_tenant_http_responses_total", tenant="") == 1
    assert total(other, "rl_sandbox_tenant_executions_total", tenant="other") == 1
    assert 'tenant="default"' not in other and 'tenant=""' not in other
