"""E2B sandboxes in Redis (keys.e2b_*): records that expire with their sandbox, each tenant's index
for listing, and each sandbox's code contexts with their cell counts.

The record's key carries the sandbox's end as its expiry, so a sandbox past its timeout is simply
absent (404), as on E2B. Its sessions are not ended then: they expire by `session_ttl_s`, which
bounds every sandbox timeout, so a sandbox never outlives its sessions' state.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from sandbox_service import keys
from sandbox_service.api.compat.e2b import DEFAULT_CONTEXT, SandboxRecord

KEPT_CELLS = 32
KEPT_SOURCE_CHARS = 16384


LOCK_POLL_S = 0.02
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"


class SandboxStore:
    """Reads and writes of E2B sandbox records on the API's asyncio Redis client."""

    def __init__(self, redis: Any, queue: str) -> None:
        self._redis = redis
        self._queue = queue

    def _key(self, sandbox_id: str) -> str:
        return keys.e2b_sandbox(self._queue, sandbox_id)

    def _contexts(self, sandbox_id: str) -> str:
        return keys.e2b_contexts(self._queue, sandbox_id)

    async def put(self, record: SandboxRecord) -> None:
        """Store a new or extended record, expiring at its end."""
        end_ms = math.ceil(record.end_at * 1000)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key(record.sandbox_id), record.to_json(), pxat=end_ms)
            pipe.hsetnx(self._contexts(record.sandbox_id), DEFAULT_CONTEXT, 0)
            pipe.pexpireat(self._contexts(record.sandbox_id), end_ms)
            pipe.zadd(
                keys.e2b_owned(self._queue, record.tenant), {record.sandbox_id: record.end_at}
            )
            await pipe.execute()

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        """The live record of `sandbox_id`, or None."""
        raw = await self._redis.get(self._key(sandbox_id))
        if raw is None:
            return None
        record = SandboxRecord.from_json(raw)
        return record if record.end_at > time.time() else None

    async def delete(self, record: SandboxRecord) -> list[str]:
        """Forget the sandbox; the ids of its contexts (whose sessions the caller ends)."""
        contexts = await self.contexts(record.sandbox_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(
                self._key(record.sandbox_id),
                self._contexts(record.sandbox_id),
                *(keys.e2b_cells(self._queue, record.sandbox_id, c) for c in contexts),
            )
            pipe.zrem(keys.e2b_owned(self._queue, record.tenant), record.sandbox_id)
            await pipe.execute()
        return list(contexts)

    async def owned(self, tenant: str) -> list[SandboxRecord]:
        """The live sandboxes of `tenant`, oldest first."""
        index = keys.e2b_owned(self._queue, tenant)
        await self._redis.zremrangebyscore(index, "-inf", time.time())
        ids = [
            i.decode() if isinstance(i, bytes) else i
            for i in await self._redis.zrange(index, 0, -1)
        ]
        if not ids:
            return []
        raws = await self._redis.mget([self._key(i) for i in ids])
        records = [SandboxRecord.from_json(raw) for raw in raws if raw is not None]
        return sorted(records, key=lambda r: r.started_at)

    async def count_owned(self, tenant: str) -> int:
        """How many sandboxes of `tenant` live now."""
        return int(
            await self._redis.zcount(keys.e2b_owned(self._queue, tenant), time.time(), "+inf")
        )

    async def contexts(self, sandbox_id: str) -> dict[str, int]:
        """The sandbox's contexts and the cells each has run."""
        raw = await self._redis.hgetall(self._contexts(sandbox_id))
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}

    @contextlib.asynccontextmanager
    async def locked(self, sandbox_id: str, hold_s: float) -> AsyncIterator[None]:
        """Hold the sandbox's lock, across API replicas (a holder that dies frees it after
        `hold_s`): a context's switch and its cell run back to back."""
        key, token = keys.e2b_lock(self._queue, sandbox_id), secrets.token_hex(8)
        for _ in itertools.count():  # polled: Redis tells no waiter when a lock is freed
            if await self._redis.set(key, token, nx=True, px=math.ceil(hold_s * 1000)):
                break
            await asyncio.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            await self._redis.eval(_RELEASE, 1, key, token)

    async def has_contexts(self, sandbox_id: str) -> bool:
        """Whether the sandbox has contexts besides its default one."""
        return int(await self._redis.hlen(self._contexts(sandbox_id))) > 1

    async def add_context(self, record: SandboxRecord, context_id: str) -> None:
        """Record a new context."""
        await self._redis.hsetnx(self._contexts(record.sandbox_id), context_id, 0)

    async def remove_context(self, sandbox_id: str, context_id: str) -> bool:
        """Forget a context; whether it existed."""
        await self._redis.delete(keys.e2b_cells(self._queue, sandbox_id, context_id))
        return bool(await self._redis.hdel(self._contexts(sandbox_id), context_id))

    async def count_cell(self, sandbox_id: str, context_id: str) -> int:
        """Count one more cell of a context; its new count."""
        return int(await self._redis.hincrby(self._contexts(sandbox_id), context_id, 1))

    async def reset_context(self, sandbox_id: str, context_id: str) -> None:
        """A restarted context counts from zero (and forgets its cells)."""
        await self._redis.hset(self._contexts(sandbox_id), context_id, 0)
        await self._redis.delete(keys.e2b_cells(self._queue, sandbox_id, context_id))

    async def record_cell(
        self, record: SandboxRecord, context_id: str, count: int, source: str
    ) -> None:
        """Keep a cell's source for the tracebacks of later cells (the last KEPT_CELLS cells of
        the context, each up to KEPT_SOURCE_CHARS)."""
        if len(source) > KEPT_SOURCE_CHARS:
            return
        key = keys.e2b_cells(self._queue, record.sandbox_id, context_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, json.dumps([count, source]))
            pipe.ltrim(key, 0, KEPT_CELLS - 1)
            pipe.pexpireat(key, math.ceil(record.end_at * 1000))
            await pipe.execute()

    async def cells(self, sandbox_id: str, context_id: str) -> list[tuple[int, str]]:
        """The context's kept cells, latest first."""
        raw = await self._redis.lrange(keys.e2b_cells(self._queue, sandbox_id, context_id), 0, -1)
        kept: list[tuple[int, str]] = []
        for item in raw:
            count, source = json.loads(item)
            kept.append((int(count), str(source)))
        return kept
