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

Stored once: a session's cells are the sealed segments its `chain` names, then its own list. A
fork renames the parent's own list into a new segment and gives each fork the chain by
reference, so no script does work in the bytes recorded (only in the number of forks and
segments); the cells themselves are read with plain LRANGEs outside the scripts. Each stored list
is charged to its tenant until it expires (keys.recorded_bytes, keys.recorded_until): the API
refuses a session cell that would take its session past `max_session_recorded_bytes` or its
tenant past `max_tenant_recorded_bytes` (recorded_usage).

Expiry: the keys live `session_ttl_s` after a session's last cell ended. While a cell is queued or
runs they are kept at least `inflight_s` longer (the queue deadline plus the job budget), so that
a session never expires under a cell that uses it, however small the TTL. A segment lives as long
as the longest-lived session whose chain names it: each script that keeps a session alive keeps
its chain alive too.
"""

from __future__ import annotations

import base64
import json
import math
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis

from sandbox_service import keys
from sandbox_service.broker.liveness import Liveness
from sandbox_service.execution import RecordedCell
from sandbox_service.settings import Settings
from sandbox_service.tenancy import tenant_of

# Raise a key's time to live to at least ttl (a key without one gets it; a missing key stays so).
_EXTEND = """
local function extend(key, ttl)
  if redis.call('TTL', key) < tonumber(ttl) then redis.call('EXPIRE', key, ttl) end
end
"""

# A stored list (a session's own cells or a segment) stays charged to its tenant until it expires:
# `hold` raises its expiry in the tenant's zset; `prune` uncharges lists that expired (a bounded
# number per call: each list is pruned once, so the work is amortised over the lists recorded).
_CHARGES = """
local function hold(until_key, unit, now, ttl)
  redis.call('ZADD', until_key, 'GT', tonumber(now) + tonumber(ttl), unit)
end
local function prune(until_key, bytes_key, now)
  local due = redis.call('ZRANGEBYSCORE', until_key, '-inf', now, 'LIMIT', 0, 256)
  for _, unit in ipairs(due) do
    local left = redis.call('TTL', unit)
    if left > 0 then
      redis.call('ZADD', until_key, tonumber(now) + left, unit)
    else
      local size = tonumber(redis.call('HGET', bytes_key, unit) or '0')
      redis.call('HDEL', bytes_key, unit)
      redis.call('ZREM', until_key, unit)
      if size ~= 0 then redis.call('HINCRBY', bytes_key, 'total', -size) end
    end
  end
end
"""

# The session's chain of sealed segments (hash field `chain`: ids, oldest first) lives at least as
# long as the session: work in the number of segments, never in their bytes.
_CHAIN = (
    _EXTEND
    + _CHARGES
    + """
local function keep_chain(hash, prefix, until_key, now, ttl)
  local chain = redis.call('HGET', hash, 'chain')
  if not chain then return end
  for id in string.gmatch(chain, '%S+') do
    extend(prefix .. id, ttl)
    hold(until_key, prefix .. id, now, ttl)
  end
end
"""
)

# KEYS: session hash, cells list, alive zset, tenant's recorded-until. ARGV: random int,
# alive_since, in-flight TTL (s), claim (0/1), now, segment key prefix. Returns the owner (""
# when no worker is alive); claim=0 (ending a session) only finds the live owner.
_CLAIM = (
    _CHAIN
    + """
local function keep()
  extend(KEYS[1], ARGV[3])
  extend(KEYS[2], ARGV[3])
  keep_chain(KEYS[1], ARGV[6], KEYS[4], ARGV[5], ARGV[3])
end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner then
  local beat = redis.call('ZSCORE', KEYS[3], owner)
  if beat and tonumber(beat) >= tonumber(ARGV[2]) then
    if ARGV[4] == '1' then keep() end
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
keep()
return chosen
"""
)

# KEYS: session hash, cells list, tenant's recorded-until. ARGV: the cell count the worker's
# interpreter has seen (-1: none), in-flight TTL (s), now, segment key prefix. Returns {n} when
# that is the session's state, else {n, based, chain}: the cells are the chain's segments, then
# the first n - based of the cells list (read outside the script); n = -1: no session.
_STATE = (
    _CHAIN
    + """
local n = redis.call('HGET', KEYS[1], 'n')
if not n then return {-1} end
extend(KEYS[1], ARGV[2])
extend(KEYS[2], ARGV[2])
keep_chain(KEYS[1], ARGV[4], KEYS[3], ARGV[3], ARGV[2])
if n == ARGV[1] then return {tonumber(n)} end
local based = tonumber(redis.call('HGET', KEYS[1], 'based') or '0')
return {tonumber(n), based, redis.call('HGET', KEYS[1], 'chain') or ''}
"""
)

# KEYS: session hash, cells list, tenant's recorded-until, tenant's recorded-bytes. ARGV: expected
# n, ttl_s, worker, now, segment key prefix, cell and its size (absent: only refresh). Appends the
# cell if the session is still at n, charged to the session and its tenant; returns the new n,
# or -1 when it moved on.
_RECORD = (
    _CHAIN
    + """
local n = redis.call('HGET', KEYS[1], 'n')
if not n or tonumber(n) ~= tonumber(ARGV[1]) then return -1 end
prune(KEYS[3], KEYS[4], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[2])
keep_chain(KEYS[1], ARGV[5], KEYS[3], ARGV[4], ARGV[2])
if #ARGV < 7 then
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  return tonumber(n)
end
redis.call('RPUSH', KEYS[2], ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'bytes', ARGV[7])
redis.call('HINCRBY', KEYS[4], KEYS[2], ARGV[7])
redis.call('HINCRBY', KEYS[4], 'total', ARGV[7])
hold(KEYS[3], KEYS[2], ARGV[4], ARGV[2])
redis.call('HSET', KEYS[1], 'n', tonumber(n) + 1, 'owner', ARGV[3])
return tonumber(n) + 1
"""
)

# KEYS: session hash. ARGV: worker. Drops the affinity if that worker holds it.
_RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  return redis.call('HDEL', KEYS[1], 'owner')
end
return 0
"""

# KEYS: session hash, cells list, tenant's recorded-until, tenant's recorded-bytes. Deletes the
# session and uncharges its own cells; its sealed segments stay (and stay charged) while a fork
# uses them, until they expire. Returns whether the session existed.
_FORGET = """
local size = tonumber(redis.call('HGET', KEYS[4], KEYS[2]) or '0')
if size ~= 0 then
  redis.call('HDEL', KEYS[4], KEYS[2])
  redis.call('HINCRBY', KEYS[4], 'total', -size)
end
redis.call('ZREM', KEYS[3], KEYS[2])
return redis.call('DEL', KEYS[1], KEYS[2])
"""

# KEYS: parent hash, parent cells, tenant's recorded-until, tenant's recorded-bytes, the new
# segment, then each fork's hash and cells. ARGV: ttl_s, owner ("": none), now, segment key
# prefix, the new segment's id. The parent's own cells (if any) become a sealed segment by a
# rename; every fork gets the parent's chain, count and bytes by reference, and the owner that
# holds its live copy (none: its first cell claims one). Work in the number of forks and
# segments, never in the bytes recorded. Returns the parent's n, or -1 when there is no such
# session.
_FORK = (
    _CHAIN
    + """
local n = redis.call('HGET', KEYS[1], 'n')
if not n then return -1 end
if redis.call('LLEN', KEYS[2]) > 0 then
  redis.call('RENAME', KEYS[2], KEYS[5])
  local size = redis.call('HGET', KEYS[4], KEYS[2])
  redis.call('HDEL', KEYS[4], KEYS[2])
  redis.call('ZREM', KEYS[3], KEYS[2])
  if size then redis.call('HSET', KEYS[4], KEYS[5], size) end
  local chain = redis.call('HGET', KEYS[1], 'chain')
  chain = chain and (chain .. ' ' .. ARGV[5]) or ARGV[5]
  redis.call('HSET', KEYS[1], 'chain', chain, 'based', n)
end
keep_chain(KEYS[1], ARGV[4], KEYS[3], ARGV[3], ARGV[1])
local fields = {'n', n}
for _, name in ipairs({'chain', 'based', 'bytes'}) do
  local value = redis.call('HGET', KEYS[1], name)
  if value then
    table.insert(fields, name)
    table.insert(fields, value)
  end
end
if ARGV[2] ~= '' then
  table.insert(fields, 'owner')
  table.insert(fields, ARGV[2])
end
for i = 6, #KEYS, 2 do
  redis.call('DEL', KEYS[i], KEYS[i + 1])
  redis.call('HSET', KEYS[i], unpack(fields))
  redis.call('EXPIRE', KEYS[i], ARGV[1])
end
return tonumber(n)
"""
)

# KEYS: tenant's recorded-until, tenant's recorded-bytes, then session hashes. ARGV: now.
# Prunes what expired; returns {the tenant's stored bytes, each session's recorded bytes}.
_USAGE = (
    _CHARGES
    + """
prune(KEYS[1], KEYS[2], ARGV[1])
local out = {tonumber(redis.call('HGET', KEYS[2], 'total') or '0')}
for i = 3, #KEYS do
  table.insert(out, tonumber(redis.call('HGET', KEYS[i], 'bytes') or '0'))
end
return out
"""
)


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


def estimated_record_bytes(code: str, stdin: str, files_b64: Mapping[str, str]) -> int:
    """About the bytes a cell's record takes (encode_cell), from its request (files in base64),
    without encoding it: what the API charges before the cell runs."""
    return (
        len(code.encode())
        + len(stdin.encode())
        + sum(len(path.encode()) + len(data) + 8 for path, data in files_b64.items())
        + 38
    )


@dataclass(frozen=True, slots=True)
class RecordedUsage:
    """A tenant's stored recorded bytes, and some of its sessions' own, as the API reads them."""

    tenant_bytes: int
    session_bytes: tuple[int, ...]


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
        self._segments = keys.segment(queue_name, "")
        self._claim = connection.register_script(_CLAIM)
        self._state = connection.register_script(_STATE)
        self._record = connection.register_script(_RECORD)
        self._release = connection.register_script(_RELEASE)
        self._fork = connection.register_script(_FORK)
        self._forget = connection.register_script(_FORGET)

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

    def _charges(self, session_id: str) -> list[str]:
        """The tenant's recorded-until and recorded-bytes keys."""
        tenant = tenant_of(session_id)
        return [keys.recorded_until(self._queue, tenant), keys.recorded_bytes(self._queue, tenant)]

    # --- API side -----------------------------------------------------------------------------

    def route(self, sessions: Sequence[tuple[str, bool]]) -> list[str]:
        """The RQ queue for each (session id, is a cell): the owner's own queue or the shared one.

        A cell claims an owner for its session (recorded, so that the next cells follow it); an
        end-session request only finds the live owner, else goes to the shared queue.
        """
        alive_since = self._liveness.alive_since()
        now = time.time()
        with self._redis.pipeline(transaction=False) as pipe:
            for session_id, is_cell in sessions:
                self._claim(
                    keys=[
                        *self._keys(session_id),
                        self._liveness.key,
                        self._charges(session_id)[0],
                    ],
                    args=[
                        random.getrandbits(31),
                        alive_since,
                        self._inflight_ttl_s,
                        int(is_cell),
                        now,
                        self._segments,
                    ],
                    client=pipe,
                )
            owners = pipe.execute()
        return [
            keys.worker_queue(self._queue, owner.decode()) if owner else self._queue
            for owner in owners
        ]

    def forget(self, session_id: str) -> bool:
        """Delete a session's keys; whether there were any."""
        return bool(self._forget(keys=[*self._keys(session_id), *self._charges(session_id)]))

    # --- worker side --------------------------------------------------------------------------

    def state(self, session_id: str, seen: int) -> SessionState:
        """The session's cell count, and its cells unless a live interpreter has seen `seen`."""
        for _ in range(STATE_READS):
            reply = self._state(
                keys=[*self._keys(session_id), self._charges(session_id)[0]],
                args=[seen, self._inflight_ttl_s, time.time(), self._segments],
            )
            n = int(reply[0])
            if n == seen or n < 0:
                return SessionState(n, None)
            history = self._read_history(session_id, n, int(reply[1]), _text(reply[2]).split())
            if history is not None:
                return SessionState(n, history)
        raise redis.RedisError(f"the records of session {session_id!r} kept changing while read")

    def _read_history(
        self, session_id: str, n: int, based: int, chain: Sequence[str]
    ) -> tuple[RecordedCell, ...] | None:
        """The chain's segments and the session's own first n - based cells, read outside any
        script (segments never change); None when they do not add up to n (sealed meanwhile)."""
        with self._redis.pipeline(transaction=False) as pipe:
            for segment_id in chain:
                pipe.lrange(keys.segment(self._queue, segment_id), 0, -1)
            if n > based:
                pipe.lrange(keys.session_cells(self._queue, session_id), 0, n - based - 1)
            parts = pipe.execute()
        stored = [cell for part in parts for cell in part]
        if len(stored) != n:
            return None
        return tuple(decode_cell(cell) for cell in stored)

    def record(
        self, session_id: str, expected_n: int, worker: str, cell: RecordedCell | None
    ) -> int:
        """Append `cell` (None: only keep the session alive), charged to the session and its
        tenant; the new n, or -1 if it moved on."""
        args: list[bytes | str | int | float] = [
            expected_n,
            self._ttl_s,
            worker,
            time.time(),
            self._segments,
        ]
        if cell is not None:
            encoded = encode_cell(cell)
            args += [encoded, len(encoded)]
        return int(
            self._record(keys=[*self._keys(session_id), *self._charges(session_id)], args=args)
        )

    def fork(self, session_id: str, forks: Sequence[str], owner: str | None = None) -> int:
        """Make each of `forks` a session whose recorded cells are those of `session_id`, by
        reference (its cells so far sealed into a segment they share), each with its own keys
        and TTL, owned by `owner` when that worker holds live copies; the parent's cell count,
        or -1 when it does not exist."""
        segment_id = uuid.uuid4().hex
        fork_keys = [key for fork in forks for key in self._keys(fork)]
        script_keys = [
            *self._keys(session_id),
            *self._charges(session_id),
            keys.segment(self._queue, segment_id),
            *fork_keys,
        ]
        args: list[str | int | float] = [
            self._ttl_s,
            owner or "",
            time.time(),
            self._segments,
            segment_id,
        ]
        return int(self._fork(keys=script_keys, args=args))

    def tenant_weights(self) -> dict[str, float]:
        """The tenants' weights the API replicas published (by which a worker's live sessions
        are shared); empty when none is published."""
        from sandbox_service.broker.jobqueue import read_tenant_weights

        return read_tenant_weights(self._redis, self._queue)

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


STATE_READS = 3
"""Reads of a session's records before giving up (each retried read follows a fork that sealed
the session's cells between the script and the read: rare, and never twice in a row in practice)."""


async def recorded_usage(
    connection: aioredis.Redis, queue: str, tenant: str, session_ids: Sequence[str]
) -> RecordedUsage:
    """The tenant's stored recorded bytes (what expired pruned first) and each session's."""
    script_keys = [
        keys.recorded_until(queue, tenant),
        keys.recorded_bytes(queue, tenant),
        *(keys.session(queue, session_id) for session_id in session_ids),
    ]
    reply = await connection.eval(_USAGE, len(script_keys), *script_keys, time.time())
    return RecordedUsage(int(reply[0]), tuple(int(size) for size in reply[1:]))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
