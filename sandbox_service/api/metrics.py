"""Prometheus metrics of one API process (a registry per app, so tests can build several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sandbox_service.jobs import ResultDict

_TIME_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


class Metrics:
    """The service's metrics; `render()` gives the Prometheus text format."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
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
            "rl_sandbox_queue_wait_seconds", "Time from admission to start of the run",
            buckets=_TIME_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.run_time = Histogram(
            "rl_sandbox_run_seconds", "Wall time of the program",
            buckets=_TIME_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.request_time = Histogram(
            "rl_sandbox_request_seconds", "Time the API spent on an execute request, by route",
            ["route"], buckets=_TIME_BUCKETS_S, registry=r,
        )  # fmt: skip
        self.queue_depth = Gauge("rl_sandbox_queue_depth", "Jobs waiting in the queue", registry=r)
        self.workers_alive = Gauge(
            "rl_sandbox_workers_alive", "Workers with a fresh heartbeat", registry=r
        )
        self.redis_up = Gauge(
            "rl_sandbox_redis_up", "1 when Redis answered the last scrape", registry=r
        )
        self.in_flight = Gauge(
            "rl_sandbox_in_flight_jobs", "Jobs this API process waits for", registry=r
        )
        self.lost_job_retries = Gauge(
            "rl_sandbox_lost_job_retries", "Jobs re-run because their worker was lost", registry=r
        )

    def observe_result(self, result: ResultDict) -> None:
        """Count one execution result and its times."""
        self.executions.labels(result["status"]).inc()
        self.queue_wait.observe(result["queue_time"])
        self.run_time.observe(result["wall_time"])

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
