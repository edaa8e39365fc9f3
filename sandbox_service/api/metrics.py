"""Prometheus metrics of one API process and of the live workers (a registry per app, so tests
can build several).

Names follow Prometheus' conventions: a `rl_sandbox_` prefix, counters end in `_total`, units in
base units and in the name (`_seconds`, `_bytes`). The workers' own metrics carry a `worker`
label: each worker publishes them to Redis with its heartbeat (broker/worker_stats.py) and every
API process exports those of the workers alive at the scrape, so they are cluster-wide series
(docs/service.md, "Metrics").

The open exposition (`GET /metrics`) carries aggregates only: no tenant's name or figure. Every
per-tenant series lives in `TenantMetrics` (api/tenant_metrics.py), served to a key by
`GET /metrics/tenants`; `Metrics` counts each event in both through one method per event.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sandbox_service.api.tenant_metrics import TenantMetrics
from sandbox_service.broker.worker_stats import WorkerStats
from sandbox_service.jobs import ResultDict
from trainer_client.wire import INFRASTRUCTURE_STATUSES

_TIME_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

# Counters' `_created` series double the exposition and no dashboard or rule here reads them.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]


class Metrics:
    """The service's metrics; `render()` gives the Prometheus text format."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.tenants = TenantMetrics()
        """The per-tenant series (served to a key, never on the open exposition)."""
        self.http_responses = Counter(
            "rl_sandbox_http_responses", "HTTP responses by route and status code",
            ["route", "code"], registry=r,
        )  # fmt: skip
        self.executions = Counter(
            "rl_sandbox_executions", "Execution results by status", ["status"], registry=r
        )
        self.rejected = Counter(
            "rl_sandbox_rejected_requests", "Requests refused before running, by reason",
            ["reason"], registry=r,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "rl_sandbox_queue_wait_seconds", "Time from admission to the start of the run",
            buckets=_TIME_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.execution_wall = Histogram(
            "rl_sandbox_execution_wall_seconds", "Wall-clock time the program ran",
            buckets=_TIME_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.request_duration = Histogram(
            "rl_sandbox_request_duration_seconds",
            "Time the API spent on an execute request, by route",
            ["route"], buckets=_TIME_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.queued_jobs = Gauge(
            "rl_sandbox_queued_jobs", "Jobs waiting in the queues (shared and per worker)",
            registry=r,
        )  # fmt: skip
        self.workers_alive = Gauge(
            "rl_sandbox_workers_alive", "Workers with a fresh heartbeat", registry=r
        )
        self.redis_up = Gauge(
            "rl_sandbox_redis_up", "1 when Redis answered the last scrape", registry=r
        )
        self.in_flight = Gauge(
            "rl_sandbox_in_flight_jobs", "Jobs this API process waits for", registry=r
        )
        self.scraped = ScrapedValues()
        r.register(self.scraped)

    def respond(self, route: str, code: int, tenant: str) -> None:
        """Count one HTTP response of `tenant` ("": a request of no valid key)."""
        self.http_responses.labels(route, str(code)).inc()
        self.tenants.http_responses.labels(tenant, route, str(code)).inc()

    def reject(self, reason: str, tenant: str) -> None:
        """Count one request of `tenant` refused before running."""
        self.rejected.labels(reason).inc()
        self.tenants.rejected.labels(tenant, reason).inc()

    def observe_result(self, result: ResultDict, tenant: str) -> None:
        """Count one execution result of `tenant` and its times (the run's time only when the
        program's own outcome ended it: an infrastructure status says when the service stopped
        it)."""
        self.executions.labels(result["status"]).inc()
        self.tenants.executions.labels(tenant, result["status"]).inc()
        self.queue_wait.observe(result["queue_time"])
        if result["status"] not in INFRASTRUCTURE_STATUSES:
            self.execution_wall.observe(result["wall_time"])

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class ScrapedValues(Collector):
    """Values set just before a scrape: this process's lost-job retries, the workers' stats."""

    def __init__(self) -> None:
        self.lost_job_retries = 0
        self.workers: dict[str, WorkerStats] = {}
        self.recorded_bytes = 0
        """Bytes of recorded session cells kept in Redis, in all (per tenant: tenant_metrics)."""

    def collect(self) -> Iterator[Metric]:
        """The families, from the values last set."""
        yield CounterMetricFamily(
            "rl_sandbox_lost_job_retries_total",
            "Jobs this API process re-ran because their worker was lost",
            value=self.lost_job_retries,
        )
        yield GaugeMetricFamily(
            "rl_sandbox_session_recorded_bytes",
            "Bytes of recorded session cells kept in Redis, every session's summed (a prefix "
            "forks share counted once)",
            value=self.recorded_bytes,
        )
        yield from worker_families(self.workers)


def worker_families(workers: dict[str, WorkerStats]) -> Iterable[Metric]:
    """The workers' own metrics, one series per live worker (and per status or reason)."""

    def counter(name: str, doc: str, extra: str | None = None) -> CounterMetricFamily:
        labels = ["worker"] if extra is None else ["worker", extra]
        return CounterMetricFamily(f"rl_sandbox_worker_{name}", doc, labels=labels)

    def gauge(name: str, doc: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"rl_sandbox_worker_{name}", doc, labels=["worker"])

    jobs = counter("jobs", "Jobs a worker finished, by result status", "status")
    cpu = counter("jail_cpu_seconds", "User and system CPU seconds of a worker's programs")
    starts = counter("jail_starts", "Zygote jails a worker started (one per run in cold mode)")
    failures = counter("jail_failures", "Jails that failed under a run and were replaced")
    recycles = counter("jail_recycles", "Warm jails replaced on purpose, by reason", "reason")
    throttled = counter(
        "jail_throttled_seconds", "Seconds a worker's programs were held back by its CPU limit"
    )
    memory = gauge(
        "jail_memory_above_baseline_bytes",
        "Memory the warm jail holds above its post-preload baseline",
    )
    sessions = gauge("sessions", "Sessions whose interpreter lives in the worker now")
    restores = counter(
        "session_restores", "Session cells that first rebuilt their session by replay"
    )
    ended = counter("sessions_ended", "Sessions a worker let go, by reason", "reason")
    started = gauge("start_time_seconds", "Start time of the worker process, epoch seconds")
    for name, stats in sorted(workers.items()):
        for status, count in sorted(stats.jobs.items()):
            jobs.add_metric([name, status], count)
        cpu.add_metric([name], stats.jail_cpu_seconds)
        starts.add_metric([name], stats.jail_starts)
        failures.add_metric([name], stats.jail_failures)
        for reason, count in sorted(stats.jail_recycles.items()):
            recycles.add_metric([name, reason], count)
        throttled.add_metric([name], stats.jail_throttled_seconds)
        memory.add_metric([name], stats.jail_memory_above_baseline_bytes)
        sessions.add_metric([name], stats.sessions)
        restores.add_metric([name], stats.session_restores)
        for reason, count in sorted(stats.sessions_ended.items()):
            ended.add_metric([name, reason], count)
        started.add_metric([name], stats.started_at)
    return (
        jobs, cpu, starts, failures, recycles, throttled, memory, sessions, restores, ended,
        started,
    )  # fmt: skip
