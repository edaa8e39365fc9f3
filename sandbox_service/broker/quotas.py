"""Tenants in Redis, so that every API replica and worker agrees: the tenants and weights the
workers serve (published by the API, which alone reads the keys), and the quotas: sessions,
and the end of calls in flight (their admission is counted in jobqueue.ADMIT_SCRIPT).

Both are sorted sets whose scores are the times their members stop counting (keys.py): a
member left behind by an API replica that died is pruned at that time, never counted forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

# KEYS[1]: the tenant's sessions zset. ARGV: now, expiry of the sessions used now, quota, ids...
# Refuses (false) when the ids not yet live would take the tenant past its quota; else records
# every id with the new expiry and returns the new ones (a table, perhaps empty).
_CLAIM_SESSIONS = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local new = {}
for i = 4, #ARGV do
  if not redis.call('ZSCORE', KEYS[1], ARGV[i]) then table.insert(new, ARGV[i]) end
end
if #new > 0 and redis.call('ZCARD', KEYS[1]) + #new > tonumber(ARGV[3]) then return false end
for i = 4, #ARGV do redis.call('ZADD', KEYS[1], ARGV[2], ARGV[i]) end
redis.call('EXPIREAT', KEYS[1], math.ceil(tonumber(ARGV[2])))
return new
"""


async def claim_sessions(
    redis: aioredis.Redis,
    key: str,
    session_ids: Sequence[str],
    now: float,
    lifetime_s: float,
    quota: int,
) -> list[str] | None:
    """Record the sessions as used now and return the new ones among them; None (nothing
    recorded) when those would take the tenant past `quota`."""
    args: list[str | float] = [now, now + lifetime_s, quota, *session_ids]
    reply = await redis.eval(_CLAIM_SESSIONS, 1, key, *args)
    if reply is None:
        return None
    return [item.decode() if isinstance(item, bytes) else str(item) for item in reply]


async def forget_sessions(redis: aioredis.Redis, key: str, session_ids: Sequence[str]) -> None:
    """Stop counting these sessions (ended, or claimed by a request that was not admitted)."""
    if session_ids:
        await redis.zrem(key, *session_ids)


PUBLISH_EVERY_S = 10.0
"""How often each API replica publishes its tenants (again after a Redis restart)."""


async def publish_tenants(redis: aioredis.Redis, key: str, weights: dict[str, float]) -> None:
    """Replace the published tenants (name -> weight) with `weights`, atomically."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(key)
        pipe.hset(key, mapping=weights)  # type: ignore[arg-type]
        await pipe.execute()


async def keep_published(redis: aioredis.Redis, key: str, weights: dict[str, float]) -> None:
    """Publish the tenants every PUBLISH_EVERY_S, until cancelled."""
    while True:
        try:
            await publish_tenants(redis, key, weights)
        except (RedisError, OSError) as exc:
            log.warning("publishing the tenants failed: %s", exc)
        await asyncio.sleep(PUBLISH_EVERY_S)


class InFlightRelease:
    """Removes ended calls from their tenants' in-flight sets, batched: `release` only notes
    them; the task `run` sends what accumulated in one pipeline per round."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._ended: dict[str, list[str]] = {}
        self._wake = asyncio.Event()

    def release(self, key: str, execution_ids: Sequence[str]) -> None:
        """Stop counting these calls (`key`: their tenant's set; empty: not counted)."""
        if key and execution_ids:
            self._ended.setdefault(key, []).extend(execution_ids)
            self._wake.set()

    async def run(self) -> None:
        """Send releases as they come, until cancelled."""
        while True:
            await self._wake.wait()
            try:
                await self.flush()
            except (RedisError, OSError) as exc:  # they expire at their deadline anyway
                log.warning("releasing calls in flight failed: %s", exc)
                await asyncio.sleep(0.1)

    async def flush(self) -> None:
        """Send what is noted now."""
        self._wake.clear()
        ended, self._ended = self._ended, {}
        if not ended:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, execution_ids in ended.items():
                for start in range(0, len(execution_ids), 1024):
                    pipe.zrem(key, *execution_ids[start : start + 1024])
            await pipe.execute()
