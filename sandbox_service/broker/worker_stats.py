"""The workers' own counters, published to Redis for the API's `/metrics` (one key per worker).

Each worker process writes its `WorkerStats` as JSON to `<queue>:stats:<worker>` on every
heartbeat; an API process reads the keys of the workers alive now when it is scraped, so a
worker that stopped or died drops out of `/metrics` with its heartbeat (docs/service.md,
"Metrics"). The key also expires on its own, for a worker that vanished without a word.
"""

from __future__ import annotations

import contextlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import redis
import redis.asyncio

from sandbox_service import keys
from sandbox_service.broker.liveness import Liveness

MAX_STATS_BYTES = 16_384
"""A stats value longer than this is ignored (ours are a few hundred bytes)."""


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """What one worker process did since it started (counters) and holds now (gauges)."""

    started_at: float
    """Epoch seconds the worker process started."""
    jobs: dict[str, int] = field(default_factory=dict)
    """Jobs finished, by result status."""
    jail_cpu_seconds: float = 0.0
    """User + system CPU seconds of the programs (executions and session cells)."""
    jail_starts: int = 0
    """Zygote jails started for the executor slot (one per run in cold mode)."""
    jail_failures: int = 0
    """Jails that failed under a run and were replaced."""
    jail_recycles: dict[str, int] = field(default_factory=dict)
    """Warm jails replaced on purpose, by reason (`memory`, `max_runs`)."""
    jail_throttled_seconds: float = 0.0
    """Seconds the slot's programs were held back by its CPU limit (CFS throttling)."""
    jail_memory_above_baseline_bytes: float = 0.0
    """Memory the warm jail holds above its post-preload baseline (recycled past the slack)."""
    sessions: int = 0
    """Sessions whose interpreter lives in this worker now."""
    session_restores: int = 0
    """Session cells that first rebuilt their session by replaying its recorded cells."""
    sessions_ended: dict[str, int] = field(default_factory=dict)
    """Sessions this worker let go, by reason (`deleted`, `evicted`, `expired`)."""

    def to_json(self) -> str:
        """The stored encoding."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> WorkerStats | None:
        """The stats in `text`, or None when it is not a well-formed record."""
        if len(text) > MAX_STATS_BYTES:
            return None
        try:
            raw = json.loads(text)
            return cls(
                started_at=_number(raw["started_at"]),
                jobs=_counts(raw["jobs"]),
                jail_cpu_seconds=_number(raw["jail_cpu_seconds"]),
                jail_starts=int(_number(raw["jail_starts"])),
                jail_failures=int(_number(raw["jail_failures"])),
                jail_recycles=_counts(raw["jail_recycles"]),
                jail_throttled_seconds=_number(raw["jail_throttled_seconds"]),
                jail_memory_above_baseline_bytes=_number(raw["jail_memory_above_baseline_bytes"]),
                sessions=int(_number(raw["sessions"])),
                session_restores=int(_number(raw["session_restores"])),
                sessions_ended=_counts(raw["sessions_ended"]),
            )
        except (ValueError, TypeError, KeyError):
            return None


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a number: {value!r}")
    return float(value)


def _counts(value: Any) -> dict[str, int]:
    if not isinstance(value, dict) or len(value) > 64:
        raise ValueError("not a small mapping")
    return {str(k)[:64]: int(_number(v)) for k, v in value.items()}


def ttl_s(liveness: Liveness) -> int:
    """How long a published record outlives its worker's last heartbeat."""
    return max(60, math.ceil(10 * liveness.dead_after_s))


def publish(connection: redis.Redis, liveness: Liveness, worker: str, stats: WorkerStats) -> None:
    """Store the current stats of `worker` (called with every heartbeat)."""
    key = keys.worker_stats(liveness.queue_name, worker)
    connection.set(key, stats.to_json(), ex=ttl_s(liveness))


def forget(connection: redis.Redis, liveness: Liveness, worker: str) -> None:
    """Drop a stopped worker's stats; a failure is harmless (the key expires)."""
    with contextlib.suppress(redis.RedisError):
        connection.delete(keys.worker_stats(liveness.queue_name, worker))


async def read_live(connection: redis.asyncio.Redis, liveness: Liveness) -> dict[str, WorkerStats]:
    """The stats of every worker alive now, by worker name (a worker not yet published: none)."""
    names = await liveness.live_names(connection)
    if not names:
        return {}
    values = await connection.mget([keys.worker_stats(liveness.queue_name, n) for n in names])
    out = {}
    for name, value in zip(names, values, strict=True):
        stats = None if value is None else WorkerStats.from_json(value)
        if stats is not None:
            out[name] = stats
    return out
