"""Sessions in Redis: which worker owns each session, and its recorded cells (synchronous).

A session lives in the interpreter of one worker (its owner) and, as a safety copy, in Redis as
the list of its cells whose interpreter survived. The API claims an owner when it admits a cell:
the recorded owner if it still beats, else a live worker picked at random, recorded at once, so
that every later cell of the session goes to the same worker's own queue and runs in order. The
owner appends each cell after it ran. Any worker that gets a session it does not hold (new,
evicted, expired there, or its owner died) rebuilds it by replaying the recorded cells.

Each step is one Lua script, so that claims from several API replicas and the owner's writes never
interleave. `n` (cells recorded) lets a worker tell whether its live interpreter is still the
session's latest state: a session deleted, expired or continued elsewhere meanwhile has another
`n`, and the stale interpreter is dropped.

Expiry: the keys live `session_ttl_s` after a session's last cell ended. While a cell is queued or
runs they are kept at least `inflight_s` longer (the queue deadline plus the job budget), so that
a session never expires under a cell that uses it, however small the TTL.
"""

from __future__ import annotations

import base64
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from sandbox_service import keys
from sandbox_service.broker.liveness import Liveness
from sandbox_service.execution import RecordedCell
from sandbox_service.settings import Settings

# Raise a key's time to live to at least ttl (a key without one gets it; a missing key stays so).
_EXTEND = """
local function extend(key, ttl)
  if redis.call('TTL', key) < tonumber(ttl) then redis.call('EXPIRE', key, ttl) end
end
"""

# KEYS: session hash, cells list, alive zset. ARGV: random int, alive_since, in-flight TTL (s),
# claim (0/1). Returns the owner ("" when no worker is alive); claim=0 (ending a session) only
# finds the live owner.
_CLAIM = (
    _EXTEND
    + """
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner then
  local beat = redis.call('ZSCORE', KEYS[3], owner)
  if beat and tonumber(beat) >= tonumber(ARGV[2]) then
    if ARGV[4] == '1' then
      extend(KEYS[1], ARGV[3])
      extend(KEYS[2], ARGV[3])
    end
    return owner
  end
end
if ARGV[4] ~= '1' then return '' end
local live = redis.call('ZRANGEBYSCORE', KEYS[3], ARGV[2], '+inf')
local chosen = ''
if #live > 0 then
  chosen = live[(tonumber(ARGV[1]) % #live) + 1]
  redis.call('HSET', KEYS[1], 'owner', chosen)
elseif owner then
  redis.call('HDEL', KEYS[1], 'owner')
end
redis.call('HSETNX', KEYS[1], 'n', 0)
extend(KEYS[1], ARGV[3])
extend(KEYS[2], ARGV[3])
return chosen
"""
)

# KEYS: session hash, cells list. ARGV: the cell count the worker's interpreter has seen (-1: none),
# in-flight TTL (s). Returns {n} when that is the session's state, else {n, cell, cell, ...};
# n = -1: no session.
_STATE = (
    _EXTEND
    + """
local n = redis.call('HGET', KEYS[1], 'n')
if not n then return {-1} end
extend(KEYS[1], ARGV[2])
extend(KEYS[2], ARGV[2])
if n == ARGV[1] then return {tonumber(n)} end
local out = redis.call('LRANGE', KEYS[2], 0, -1)
table.insert(out, 1, tonumber(n))
return out
"""
)

# KEYS: session hash, cells list. ARGV: expected n, ttl_s, worker, cell (absent: only refresh).
# Appends the cell if the session is still at n; returns the new n, or -1 when it moved on.
_RECORD = """
local n = redis.call('HGET', KEYS[1], 'n')
if not n or tonumber(n) ~= tonumber(ARGV[1]) then return -1 end
redis.call('EXPIRE', KEYS[1], ARGV[2])
if #ARGV < 4 then
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  return tonumber(n)
end
redis.call('RPUSH', KEYS[2], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[1], 'n', tonumber(n) + 1, 'owner', ARGV[3])
return tonumber(n) + 1
"""

# KEYS: session hash. ARGV: worker. Drops the affinity if that worker holds it.
_RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  return redis.call('HDEL', KEYS[1], 'owner')
end
return 0
"""


# KEYS: parent hash, parent cells, then each fork's hash and cells. ARGV: ttl_s, owner ("":
# none). Each fork gets the parent's recorded cells and count, and the owner that holds its
# live copy (none: its first cell claims one). Returns the parent's n, or -1 when there is no
# such session.
_FORK = """
local n = redis.call('HGET', KEYS[1], 'n')
if not n then return -1 end
local cells = redis.call('LRANGE', KEYS[2], 0, -1)
for i = 3, #KEYS, 2 do
  redis.call('DEL', KEYS[i], KEYS[i + 1])
  redis.call('HSET', KEYS[i], 'n', n)
  if ARGV[2] ~= '' then redis.call('HSET', KEYS[i], 'owner', ARGV[2]) end
  redis.call('EXPIRE', KEYS[i], ARGV[1])
  for first = 1, #cells, 1000 do
    redis.call('RPUSH', KEYS[i + 1], unpack(cells, first, math.min(first + 999, #cells)))
  end
  if #cells > 0 then redis.call('EXPIRE', KEYS[i + 1], ARGV[1]) end
end
return tonumber(n)
"""


@dataclass(frozen=True, slots=True)
class SessionState:
    """What Redis says about a session, as a worker reads it before a cell."""

    n: int
    """Cells recorded; -1: the session does not exist (deleted or expired)."""
    history: tuple[RecordedCell, ...] | None
    """The recorded cells, or None when the worker's interpreter is already at `n`."""


def encode_cell(cell: RecordedCell) -> bytes:
    """A recorded cell as stored in the session's list (JSON; files in base64)."""
    files = {path: base64.b64encode(content).decode() for path, content in cell.files.items()}
    record: dict[str, object] = {"code": cell.code, "stdin": cell.stdin, "files": files}
    if cell.seed is not None:
        record["seed"] = cell.seed
    return json.dumps(record).encode()


def decode_cell(stored: bytes) -> RecordedCell:
    """The inverse of encode_cell."""
    record = json.loads(stored)
    files = {path: base64.b64decode(content) for path, content in record["files"].items()}
    seed = record.get("seed")
    return RecordedCell(
        code=record["code"],
        stdin=record["stdin"],
        files=files,
        seed=None if seed is None else int(seed),
    )


class SessionStore:
    """Owner claims and recorded cells of sessions, for the API and for workers."""

    def __init__(
        self,
        connection: redis.Redis,
        queue_name: str,
        ttl_s: int,
        dead_after_s: float,
        inflight_s: float = 0.0,
    ) -> None:
        self._redis = connection
        self._queue = queue_name
        self._ttl_s = ttl_s
        self._inflight_ttl_s = ttl_s + math.ceil(inflight_s)
        self._liveness = Liveness(queue_name, dead_after_s)
        self._claim = connection.register_script(_CLAIM)
        self._state = connection.register_script(_STATE)
        self._record = connection.register_script(_RECORD)
        self._release = connection.register_script(_RELEASE)
        self._fork = connection.register_script(_FORK)

    @classmethod
    def for_settings(cls, connection: redis.Redis, settings: Settings) -> SessionStore:
        """The store of a service configured by `settings`."""
        inflight_s = settings.queue_deadline_s + settings.job_timeout_s(settings.max_timeout)
        return cls(
            connection,
            settings.queue_name,
            settings.session_ttl_s,
            settings.worker_dead_after_s,
            inflight_s,
        )

    def _keys(self, session_id: str) -> list[str]:
        return [keys.session(self._queue, session_id), keys.session_cells(self._queue, session_id)]

    # --- API side -----------------------------------------------------------------------------

    def route(self, sessions: Sequence[tuple[str, bool]]) -> list[str]:
        """The RQ queue for each (session id, is a cell): the owner's own queue or the shared one.

        A cell claims an owner for its session (recorded, so that the next cells follow it); an
        end-session request only finds the live owner, else goes to the shared queue.
        """
        alive_since = self._liveness.alive_since()
        with self._redis.pipeline(transaction=False) as pipe:
            for session_id, is_cell in sessions:
                self._claim(
                    keys=[*self._keys(session_id), self._liveness.key],
                    args=[random.getrandbits(31), alive_since, self._inflight_ttl_s, int(is_cell)],
                    client=pipe,
                )
            owners = pipe.execute()
        return [
            keys.worker_queue(self._queue, owner.decode()) if owner else self._queue
            for owner in owners
        ]

    def forget(self, session_id: str) -> bool:
        """Delete a session's keys; whether there were any."""
        return bool(self._redis.delete(*self._keys(session_id)))

    # --- worker side --------------------------------------------------------------------------

    def state(self, session_id: str, seen: int) -> SessionState:
        """The session's cell count, and its cells unless a live interpreter has seen `seen`."""
        reply = self._state(keys=self._keys(session_id), args=[seen, self._inflight_ttl_s])
        n = int(reply[0])
        if n == seen or n < 0:
            return SessionState(n, None)
        return SessionState(n, tuple(decode_cell(cell) for cell in reply[1:]))

    def record(
        self, session_id: str, expected_n: int, worker: str, cell: RecordedCell | None
    ) -> int:
        """Append `cell` (None: only keep the session alive); the new n, or -1 if it moved on."""
        args: list[bytes | str | int] = [expected_n, self._ttl_s, worker]
        if cell is not None:
            args.append(encode_cell(cell))
        return int(self._record(keys=self._keys(session_id), args=args))

    def fork(self, session_id: str, forks: Sequence[str], owner: str | None = None) -> int:
        """Make each of `forks` a session with the recorded cells of `session_id`, each with its
        own keys and TTL, owned by `owner` when that worker holds live copies; the parent's
        cell count, or -1 when it does not exist."""
        fork_keys = [key for fork in forks for key in self._keys(fork)]
        return int(
            self._fork(keys=[*self._keys(session_id), *fork_keys], args=[self._ttl_s, owner or ""])
        )

    def release(self, session_ids: Sequence[str], worker: str) -> None:
        """Drop `worker`'s affinity of sessions it no longer holds (evicted or expired)."""
        if not session_ids:
            return
        with self._redis.pipeline(transaction=False) as pipe:
            for session_id in session_ids:
                self._release(
                    keys=[keys.session(self._queue, session_id)], args=[worker], client=pipe
                )
            pipe.execute()
