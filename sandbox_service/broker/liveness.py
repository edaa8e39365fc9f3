"""Worker liveness, owned here alone: the `alive` sorted set of a queue (member: the worker's name
`<host>:<slot>:<pid>`, score: its last heartbeat, epoch seconds).

A worker beats every `worker_heartbeat_s`; one whose last beat is older than `worker_dead_after_s`
counts as dead (its running job is re-run or answered, its sessions move). The Lua scripts of
jobqueue.py and session_store.py read the same set by its key and an `alive_since` bound from here.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import redis
import redis.asyncio

from sandbox_service import keys
from sandbox_service.settings import Settings

FORGET_AFTER_S = 3600.0
"""Members that have not beaten for this long are pruned (a host that vanished)."""


@dataclass(frozen=True, slots=True)
class Liveness:
    """The liveness set of one queue."""

    queue_name: str
    dead_after_s: float

    @classmethod
    def of(cls, settings: Settings) -> Liveness:
        """The liveness set of the service configured by `settings`."""
        return cls(settings.queue_name, settings.worker_dead_after_s)

    @property
    def key(self) -> str:
        """The sorted set's Redis key."""
        return keys.alive(self.queue_name)

    def alive_since(self, now: float | None = None) -> float:
        """Workers whose last beat is at or after this epoch second are alive."""
        return (time.time() if now is None else now) - self.dead_after_s

    def beat(self, connection: redis.Redis, name: str, now: float | None = None) -> None:
        """Record a heartbeat of `name` (and prune long-gone members)."""
        now = time.time() if now is None else now
        with connection.pipeline(transaction=False) as pipe:
            pipe.zadd(self.key, {name: now})
            pipe.zremrangebyscore(self.key, "-inf", now - FORGET_AFTER_S)
            pipe.execute()

    def leave(self, connection: redis.Redis, name: str) -> None:
        """Remove `name` now (a clean stop); a failure is harmless: its beat goes stale."""
        with contextlib.suppress(redis.RedisError):
            connection.zrem(self.key, name)

    def live_workers(self, connection: redis.Redis) -> list[str]:
        """Names of the workers alive now."""
        members = connection.zrangebyscore(self.key, self.alive_since(), "+inf")
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]

    def live_workers_of_host(self, connection: redis.Redis, host: str) -> list[str]:
        """Names of the workers of `host` alive now (a container's health check)."""
        return [name for name in self.live_workers(connection) if name.startswith(f"{host}:")]

    async def live_names(self, connection: redis.asyncio.Redis) -> list[str]:
        """Names of the workers alive now (the API's view, for their metrics)."""
        members = await connection.zrangebyscore(self.key, self.alive_since(), "+inf")
        return [m.decode() if isinstance(m, bytes) else str(m) for m in members]

    async def count_live(self, connection: redis.asyncio.Redis) -> int:
        """How many workers are alive now (readiness)."""
        count: int = await connection.zcount(self.key, self.alive_since(), "+inf")
        return count
