"""The worker's own counters: the job thread adds to them, the heartbeat thread publishes them.

Jail counters live on the executor; an executor that is replaced (`JobRunner.reset`) leaves its
counts here first, so the published counters only grow for the life of the worker process.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from typing import TYPE_CHECKING

from sandbox_service.broker.worker_stats import WorkerStats

if TYPE_CHECKING:
    from sandbox_service.jail.zygotes import SlotExecutor

MIB = 1024 * 1024


class Tally:
    """Jobs by status, program CPU, session restores and ends, carried jail counters."""

    def __init__(self, started_at: float | None = None) -> None:
        self.started_at = time.time() if started_at is None else started_at
        self._lock = threading.Lock()
        self._jobs: collections.Counter[str] = collections.Counter()
        self._cpu_seconds = 0.0
        self._restores = 0
        self._sessions_ended: collections.Counter[str] = collections.Counter()
        self._retired: collections.Counter[str] = collections.Counter()
        self._retired_throttled_s = 0.0

    def job_done(self, status: str, cpu_seconds: float = 0.0, restored: bool = False) -> None:
        """Count one finished job."""
        with self._lock:
            self._jobs[status] += 1
            self._cpu_seconds += max(0.0, cpu_seconds)
            self._restores += restored

    def sessions_ended(self, reason: str, count: int = 1) -> None:
        """Count sessions let go (`deleted`, `evicted`, `expired`)."""
        if count:
            with self._lock:
                self._sessions_ended[reason] += count

    def retire(self, executor: SlotExecutor) -> None:
        """Keep the counts of an executor about to be closed."""
        counts = _executor_counts(executor)
        throttled_s = _throttled_s(executor)
        with self._lock:
            self._retired.update(counts)
            self._retired_throttled_s += throttled_s

    def snapshot(self, executor: SlotExecutor | None, live_sessions: int) -> WorkerStats:
        """The stats to publish now (from any thread)."""
        counts = collections.Counter(_executor_counts(executor) if executor else {})
        throttled_s = _throttled_s(executor) if executor else 0.0
        memory_mb = None
        if executor is not None:
            with contextlib.suppress(Exception):  # the jail may be replaced meanwhile
                memory_mb = executor.memory_above_baseline_mb()
        with self._lock:
            counts.update(self._retired)
            return WorkerStats(
                started_at=self.started_at,
                jobs=dict(self._jobs),
                jail_cpu_seconds=round(self._cpu_seconds, 6),
                jail_starts=counts["starts"],
                jail_failures=counts["failures"],
                jail_recycles={"memory": counts["memory"], "max_runs": counts["max_runs"]},
                jail_throttled_seconds=round(throttled_s + self._retired_throttled_s, 6),
                jail_memory_above_baseline_bytes=max(0.0, (memory_mb or 0.0) * MIB),
                sessions=live_sessions,
                session_restores=self._restores,
                sessions_ended=dict(self._sessions_ended),
            )


def _executor_counts(executor: SlotExecutor) -> dict[str, int]:
    return {
        "starts": executor.jail_starts,
        "failures": executor.jail_failures,
        "memory": executor.memory_recycles,
        "max_runs": executor.max_runs_recycles,
    }


def _throttled_s(executor: SlotExecutor) -> float:
    try:
        return executor.cpu_throttling().throttled_us / 1e6
    except OSError:  # its cgroups were removed meanwhile
        return 0.0
