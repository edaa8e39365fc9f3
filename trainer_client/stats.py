"""Client-side counters: what the client did, readable from code (`client.stats()`)."""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

LATENCY_SAMPLES = 10_000
"""Most recent latencies kept for percentiles (memory stays bounded on long runs)."""


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles over the most recent samples, in seconds; zeros when there are none."""

    count: int = 0
    """Samples ever recorded (percentiles use the last LATENCY_SAMPLES)."""
    mean_s: float = 0.0
    p50_s: float = 0.0
    p90_s: float = 0.0
    p99_s: float = 0.0
    max_s: float = 0.0


def percentile(sorted_samples: list[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of already sorted samples."""
    if not sorted_samples:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(sorted_samples)))
    return sorted_samples[rank - 1]


def summarize(samples: deque[float], count: int, total_s: float, max_s: float) -> LatencySummary:
    """A LatencySummary of a window of samples plus running totals."""
    ordered = sorted(samples)
    return LatencySummary(
        count=count,
        mean_s=total_s / count if count else 0.0,
        p50_s=percentile(ordered, 50),
        p90_s=percentile(ordered, 90),
        p99_s=percentile(ordered, 99),
        max_s=max_s,
    )


@dataclass(frozen=True, slots=True)
class ClientStats:
    """A snapshot of the counters of one client."""

    calls: int
    """Calls submitted (execute, execute_many items)."""
    results: int
    """Calls answered with an ExecuteResult."""
    failures: int
    """Calls that ended in an exception (invalid, deadline, retries exhausted, service error)."""
    cancelled: int
    """Calls whose caller gave up (task cancelled) before the answer."""
    infrastructure: dict[str, int]
    """Results the service answered with an infrastructure status (after any retries), by
    status: `cancelled`, `deadline_exceeded`, and `queue_timeout`/`sandbox_error` whose retries
    ran out. Counted in `results` too; never the program's doing."""
    in_flight_calls: int
    """Calls submitted and not yet answered."""
    http_requests: int
    """POST /execute/batch requests sent."""
    http_failures: dict[str, int]
    """Failed requests by cause: HTTP status ("429", "503") or exception name ("ConnectError")."""
    retries: int
    """Item re-submissions (whole-batch failures count once per item)."""
    retry_causes: dict[str, int]
    """Re-submissions by cause: "429", "ConnectError", "queue_timeout", ..."""
    batch_sizes: dict[int, int]
    """How many requests carried each number of items."""
    call_latency: LatencySummary
    """From execute() to its end (result or exception), retries included."""
    http_latency: LatencySummary
    """One POST /execute/batch, from send to parsed answer."""

    @property
    def mean_batch_size(self) -> float:
        """Items per HTTP request, on average."""
        items = sum(size * n for size, n in self.batch_sizes.items())
        return items / self.http_requests if self.http_requests else 0.0


@dataclass
class _Latencies:
    samples: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_SAMPLES))
    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    def record(self, seconds: float) -> None:
        self.samples.append(seconds)
        self.count += 1
        self.total_s += seconds
        self.max_s = max(self.max_s, seconds)

    def summary(self) -> LatencySummary:
        return summarize(self.samples, self.count, self.total_s, self.max_s)


@dataclass
class Counters:
    """The mutable counters behind ClientStats; only the event loop's thread writes them."""

    calls: int = 0
    results: int = 0
    failures: int = 0
    cancelled: int = 0
    infrastructure: Counter[str] = field(default_factory=Counter)
    http_requests: int = 0
    retries: int = 0
    http_failures: Counter[str] = field(default_factory=Counter)
    retry_causes: Counter[str] = field(default_factory=Counter)
    batch_sizes: Counter[int] = field(default_factory=Counter)
    call_latency: _Latencies = field(default_factory=_Latencies)
    http_latency: _Latencies = field(default_factory=_Latencies)

    def snapshot(self) -> ClientStats:
        """A consistent, immutable copy."""
        return ClientStats(
            calls=self.calls,
            results=self.results,
            failures=self.failures,
            cancelled=self.cancelled,
            infrastructure=dict(self.infrastructure),
            in_flight_calls=self.calls - self.results - self.failures - self.cancelled,
            http_requests=self.http_requests,
            http_failures=dict(self.http_failures),
            retries=self.retries,
            retry_causes=dict(self.retry_causes),
            batch_sizes=dict(sorted(self.batch_sizes.items())),
            call_latency=self.call_latency.summary(),
            http_latency=self.http_latency.summary(),
        )
