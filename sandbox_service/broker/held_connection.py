"""One asyncio Redis connection held by one task that sends a command per round, on the API's hot
path (the admission loop, the reply listener).

redis-py's client call checks a connection out of the pool and back in, wraps the command in its
retry policy and records it for its observability hooks: about 25 us of CPU per round trip here
(uvloop, hiredis), as much again as sending and parsing the command itself. A task that sends one
command at a time needs none of it: it keeps one connection of the client's pool and sends on it.
The connection's own behaviour stays: it connects (again) on the next command after an error,
which it reports as redis-py's exceptions; the caller decides when to retry, as before.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError


class HeldConnection:
    """A connection of `client`'s pool, used by one task at a time; `release` gives it back."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._pool = client.connection_pool
        self._connection: AbstractConnection | None = None

    async def execute(self, *args: Any) -> Any:
        """Send one command and return its parsed reply (RedisError, OSError when it fails)."""
        if self._connection is None:
            self._connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
        await self._connection.send_command(*args, check_health=False)
        return await self._connection.read_response()

    async def run_script(self, script: str, keys: list[str], args: list[Any]) -> Any:
        """EVALSHA of `script`, loading it with EVAL when Redis does not hold it (a restart)."""
        try:
            return await self.execute("EVALSHA", script_sha(script), len(keys), *keys, *args)
        except NoScriptError:
            return await self.execute("EVAL", script, len(keys), *keys, *args)

    async def release(self) -> None:
        """Give the connection back to the pool."""
        if self._connection is not None:
            connection, self._connection = self._connection, None
            await self._pool.release(connection)


@functools.cache
def script_sha(script: str) -> str:
    """The SHA1 digest Redis names a script by."""
    return hashlib.sha1(script.encode()).hexdigest()
