"""The RQ edge: the only module that imports rq. Enqueue side for the API, worker loop for workers.

Jobs are ordinary RQ jobs (JSON serializer, never pickle), so `rq info` and RQ's registries see
them. The API writes their records as RQ does, without RQ's Job objects (rq_format.py: a third
of the CPU, tested against RQ's own). There is one shared queue, and each worker has its own
queue (session cells go to the worker that holds the session, see session_store.py). With a
tenants file each tenant has its own shared queue (keys.tenant_queue); the API publishes the
tenants and weights in Redis (keys.tenants) and idle workers re-read them every few seconds, so
workers never hold the keys. A worker listens on its own queue and every tenant's queue with
RQ's multi-queue BLPOP (the first non-empty queue of its list wins) and, after each job, reorders
that list by fair_share.FairOrder: tenants in proportion to their weights (in calls: each call of
a chunk counts), its own queue (session cells) as much as all tenants together, so neither
session cells nor stateless calls starve the other. One tenant, no own queue traffic: RQ's
round robin, as before.
RQ's stock worker costs about 70 Redis commands and 9 ms of CPU per job (measured here: 113
no-op jobs/s per worker), more than a warm jailed `print(1)` itself. So `LeanWorker` keeps RQ's
loop (blocking dequeue, registration, signals, suspension, maintenance) and replaces the per-job
bookkeeping with two Lua scripts, three round trips per job with the dequeue:

    BLPOP own and shared, in turn (RQ) -> [PREPARE_SCRIPT: if the job hash exists, RQ's
      "started by <worker>" HSET (and LREM of BLMOVE's intermediate list, when a worker listens
      on one queue only), then HMGET of the fields the worker reads, EXISTS cancel marker]
      -> handler runs the program -> [DELIVER_SCRIPT: SET result, RPUSH notice, DEL job hash]

A chunk (several calls of one batch in one job) runs its calls in turn and delivers their
results a few at a time, in one DELIVER_SCRIPT each (outbox.py). Fair share holds at the call,
not the chunk: before each call of a chunk after its first, the worker takes one job waiting in a
queue ahead of the chunk's in the fair order (another tenant's call, or a session cell of its
own queue; TAKE_SCRIPT, one round trip) and runs it first. A job taken so runs whole (a chunk
taken between calls does not itself take others), so the nesting is one deep.

RQ's own fetch (HGETALL and five date parses) is skipped: its dequeue hands out a DequeuedJob
whose fields come with the prepare script's reply. (RQ dequeues from two queues with BLPOP, not
BLMOVE: a worker SIGKILLed in the microseconds between its BLPOP and its prepare leaves the job
in no list; its request is answered sandbox_error at its wait deadline.)

Invariant the API watchdog relies on: a job hash that is gone means its result is stored (both
change in one script, atomically), unless Redis itself lost the data. A started job is watched
through its `worker_name` and that worker's heartbeat in the `alive` set, not RQ's
StartedJobRegistry (whose abandoned-job detection waits job timeout + 60 s).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import redis
import redis.asyncio as aioredis
from redis.connection import HiredisRespSerializer
from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException
from rq.worker import DequeueStrategy, WorkerStatus

from sandbox_service import keys
from sandbox_service.broker import rq_format
from sandbox_service.broker.outbox import Delivery, Outbox
from sandbox_service.cancel import CLIENT_LEFT, never_ran
from sandbox_service.execution import Status
from sandbox_service.fair_share import FairOrder
from sandbox_service.jobs import (
    JobPayload,
    ResultDict,
    chunk_from_wire,
    chunk_to_wire,
    encode_notice,
    encode_result,
    failure_result,
    item_id,
    job_of,
)
from sandbox_service.logs import fields
from sandbox_service.tenancy import TENANT_NAME

if TYPE_CHECKING:
    from sandbox_service.settings import Settings

log = logging.getLogger(__name__)

JOB_FUNC = "sandbox_service.worker.main.execute"
"""What the RQ job names as its function; a LeanWorker hands the payload to its handler instead."""


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job to enqueue: its id, its payload and the worker's time budget for it."""

    execution_id: str
    payload: JobPayload
    budget_s: float
    queue: str = ""
    """RQ queue name to enqueue on (a worker's own queue); empty: the shared queue."""
    items: tuple[JobPayload, ...] = ()
    """A chunk: these calls (`payload` is the first), run in turn by one worker; item i's
    execution id is jobs.item_id(execution_id, i)."""
    item_budgets_s: tuple[float, ...] = ()

    @classmethod
    def of(cls, execution_id: str, payload: JobPayload, settings: Settings) -> NewJob:
        """The job of `payload`, with the budget the settings give it."""
        return cls(execution_id, payload, payload.worker_budget_s(settings))

    @classmethod
    def chunk(
        cls,
        chunk_id: str,
        items: Sequence[JobPayload],
        settings: Settings,
        budgets_s: Sequence[float] | None = None,
        queue: str = "",
    ) -> NewJob:
        """One job of several stateless calls; its budget is the sum of theirs (`budgets_s`:
        each call's worker budget, when the caller has them)."""
        if budgets_s is None:
            budgets_s = [item.worker_budget_s(settings) for item in items]
        budgets = tuple(budgets_s)
        return cls(
            chunk_id, items[0], sum(budgets), queue, items=tuple(items), item_budgets_s=budgets
        )

    def members(self) -> list[tuple[str, JobPayload]]:
        """(execution id, payload) of each call this job carries."""
        if not self.items:
            return [(self.execution_id, self.payload)]
        return [(item_id(self.execution_id, i), item) for i, item in enumerate(self.items)]

    def wire(self) -> dict[str, Any]:
        """The JSON-ready argument of the RQ job."""
        if not self.items:
            return self.payload.to_wire()
        return chunk_to_wire(self.items, self.item_budgets_s)


@dataclass(frozen=True, slots=True)
class JobState:
    """What Redis says about one outstanding job."""

    kind: str
    """`done` (result below), `queued`, `running`, `lost` (worker dead or job vanished), or
    `stranded` (queued on the own queue of a worker that died: to be routed again)."""
    result: ResultDict | None = None
    worker: str = ""
    queue: str = ""
    """The RQ queue name the job was enqueued on."""


# KEYS[1]: the shared queue's list, KEYS[2]: the alive set, KEYS[3..]: the other tenants' shared
# queues' lists. A worker's own queue's list is keys.rq_queue(keys.worker_queue(queue, worker)),
# that is KEYS[1] .. ':w:' .. worker; the calls beyond their first of the chunks waiting in a
# shared queue's list L are keys.chunks(queue) of it, that is L .. ':chunks' (own queues hold no
# chunks). waiting(L): the calls waiting in shared queue L.
_WAITING = """
local function waiting(list)
  local calls = redis.call('LLEN', list)
  for _, extra in ipairs(redis.call('HVALS', list .. ':chunks')) do
    calls = calls + tonumber(extra)
  end
  return calls
end
local depth = waiting(KEYS[1])
for k = 3, #KEYS do depth = depth + waiting(KEYS[k]) end
for _, worker in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  depth = depth + redis.call('LLEN', KEYS[1] .. ':w:' .. worker)
end
"""

DEPTH_SCRIPT = _WAITING + "return depth"
"""Calls waiting: in the tenants' shared queues (a chunk's calls each count) and in the own
queues of registered workers."""

ADMITTED, QUEUE_FULL, TENANT_QUEUE_FULL, IN_FLIGHT_QUOTA = 1, 0, 2, 3
"""ADMIT_SCRIPT's verdicts on a group."""

ADMIT_SCRIPT = (
    _WAITING
    + """
local max_depth = tonumber(ARGV[1])
local now = ARGV[3]
local i = 4
local admitted = {}
for g = 1, tonumber(ARGV[2]) do
  local size, tenant_queue, share = tonumber(ARGV[i]), ARGV[i + 1], tonumber(ARGV[i + 2])
  local flight, max_flight, ncommands = ARGV[i + 3], tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
  i = i + 6
  local verdict = 1
  if depth + size > max_depth then
    verdict = 0
  elseif waiting(tenant_queue) + size > share then
    verdict = 2
  elseif flight ~= '' then
    redis.call('ZREMRANGEBYSCORE', flight, '-inf', now)
    if redis.call('ZCARD', flight) + size > max_flight then verdict = 3 end
  end
  if verdict == 1 then depth = depth + size end
  admitted[g] = verdict
  for _ = 1, ncommands do
    local nargs = tonumber(ARGV[i])
    if verdict == 1 then redis.call(unpack(ARGV, i + 1, i + nargs)) end
    i = i + 1 + nargs
  end
end
return admitted
"""
)
"""Admission in one round trip (KEYS and ARGV from JobQueue.admission): each group is enqueued
whole if the work waiting stays within its bound, its tenant's shared queue within the tenant's
share of that bound, and the tenant's calls in flight within its quota; else nothing of it.
Returns a verdict per group (ADMITTED, QUEUE_FULL, ...). The work waiting is every tenant's
shared queue plus the own queues (session cells) of registered workers. Atomic, so the bounds
are exact across API replicas too. Like RQ's own MULTI it touches keys it does not declare: one
Redis (or one shard), as RQ needs anyway."""


@dataclass(frozen=True, slots=True)
class GroupBounds:
    """What one admitted group must fit in besides the queue's bound: its tenant's bounds."""

    tenant_queue: str = ""
    """RQ queue name of the tenant's shared queue (empty: the shared queue)."""
    queue_share: int | None = None
    """Most jobs the tenant's shared queue may hold (None: the queue's whole bound)."""
    in_flight_key: str = ""
    """The tenant's in-flight zset (empty: no quota of calls in flight)."""
    max_in_flight: int = 0
    expires_at: float = 0.0
    """When the group's members stop counting in flight (epoch s): its wait's deadline."""


TENANTS_REFRESH_S = 5.0
"""How often an idle worker re-reads the published tenants (and how long one dequeue blocks)."""


def read_tenant_weights(connection: redis.Redis, queue_name: str) -> dict[str, float]:
    """The tenants the API replicas published (name -> weight); malformed entries skipped."""
    weights: dict[str, float] = {}
    for raw_name, raw_weight in connection.hgetall(keys.tenants(queue_name)).items():
        name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
        with contextlib.suppress(ValueError):
            weight = float(raw_weight)
            if TENANT_NAME.fullmatch(name) and math.isfinite(weight) and weight > 0:
                weights[name] = weight
    return dict(sorted(weights.items()))


WORKER_TTL_S = 60
"""RQ's worker registration TTL; RQ blocks in BLPOP for WORKER_TTL_S - 15 seconds at a time."""


def connect(redis_url: str, socket_timeout_s: float = 5.0) -> redis.Redis:
    """A synchronous client; workers need socket_timeout_s above their BLPOP block time."""
    return redis.Redis.from_url(
        redis_url, socket_connect_timeout=2.0, socket_timeout=socket_timeout_s
    )


def connect_async(redis_url: str, socket_timeout_s: float = 5.0) -> aioredis.Redis:
    """An asyncio client (the API's) that packs commands with hiredis, like the synchronous one.

    redis-py's asyncio connections pack commands in Python: about 110 us for the admission
    script's arguments of one job, 10 us with hiredis (measured here).
    """
    pool = aioredis.ConnectionPool.from_url(
        redis_url, socket_connect_timeout=2.0, socket_timeout=socket_timeout_s
    )
    pool.connection_class = _hiredis_packing(pool.connection_class)
    return aioredis.Redis.from_pool(pool)


_PACKING: dict[object, type[Any]] = {}


def _hiredis_packing(base: type[Any]) -> type[Any]:
    # untyped in redis 8.2, typed before: the ignore is for either
    packer = HiredisRespSerializer()  # type: ignore[no-untyped-call,unused-ignore]

    def pack_command(self: Any, *args: Any) -> list[bytes]:
        packed: list[bytes] = packer.pack(*args)
        return packed

    if base not in _PACKING:
        _PACKING[base] = type(f"Hiredis{base.__name__}", (base,), {"pack_command": pack_command})
    return _PACKING[base]


def connect_worker(redis_url: str) -> redis.Redis:
    """A client for a worker loop (its blocking dequeue must not hit the socket timeout)."""
    return connect(redis_url, socket_timeout_s=WORKER_TTL_S + 15)


class JobQueue:
    """Enqueue, inspect and withdraw jobs (synchronous: the API calls these from threads), and
    build the admission script's arguments (sent by the API on its asyncio client)."""

    def __init__(
        self,
        connection: redis.Redis,
        queue_name: str,
        result_ttl_s: int,
        group_ttl_s: int = 3600,
    ) -> None:
        self._redis = connection
        self._name = queue_name
        self._result_ttl_s = result_ttl_s
        self._group_ttl_s = group_ttl_s
        self._drop_script = connection.register_script(DROP_SCRIPT)

    def admission(
        self,
        groups: Sequence[Sequence[NewJob]],
        max_depth: int,
        bounds: Sequence[GroupBounds] | None = None,
        tenant_queues: Sequence[str] = (),
    ) -> tuple[list[str], list[Any]]:
        """(KEYS, ARGV) of ADMIT_SCRIPT for these groups: the commands that enqueue each group
        as RQ would, which the script runs for each group that fits (the caller sends it).

        `bounds`: each group's tenant bounds (None: none); `tenant_queues`: the RQ queue names
        of the tenants' shared queues other than the shared one (they count in the depth)."""
        argv: list[Any] = [max_depth, len(groups), time.time()]
        for g, group in enumerate(groups):
            bound = bounds[g] if bounds is not None else GroupBounds()
            commands = self._enqueue_commands(group)
            members = [member for job in group for member, _ in job.members()]
            if bound.in_flight_key:
                scored = [part for member in members for part in (bound.expires_at, member)]
                commands.append(["ZADD", bound.in_flight_key, *scored])
                commands.append(["EXPIREAT", bound.in_flight_key, math.ceil(bound.expires_at)])
            share = max_depth if bound.queue_share is None else bound.queue_share
            argv += [len(members), keys.rq_queue(bound.tenant_queue or self._name), share]
            argv += [bound.in_flight_key, bound.max_in_flight, len(commands)]
            for command in commands:
                argv.append(len(command))
                argv.extend(command)
        script_keys = [keys.rq_queue(self._name), keys.alive(self._name)]
        return script_keys + [keys.rq_queue(q) for q in tenant_queues], argv

    def _enqueue_commands(self, jobs: Sequence[NewJob], at_front: bool = False) -> list[list[Any]]:
        # RQ's own records (rq_format.py), without its Job objects: per queue, its registration,
        # each job's hash, and one push of the ids (at the front: LPUSH of the ids reversed, so
        # that they keep their order there too).
        now = rq_format.timestamp()
        by_queue: dict[str, list[NewJob]] = {}
        for job in jobs:
            by_queue.setdefault(job.queue or self._name, []).append(job)
        commands: list[list[Any]] = []
        for name, queued in by_queue.items():
            queue_key = keys.rq_queue(name)
            commands.append(["SADD", keys.rq_queues(), queue_key])
            for job in queued:
                fields = rq_format.job_fields(
                    data=rq_format.job_data(JOB_FUNC, (job.wire(),)),
                    origin=name,
                    description=job.payload.request_id or job.execution_id,
                    timeout_s=math.ceil(job.budget_s),
                    result_ttl_s=0,
                    failure_ttl_s=self._result_ttl_s,
                    now=now,
                )
                commands.append(["HSET", keys.rq_job(job.execution_id), *fields])
            extra = [(job.execution_id, len(job.items) - 1) for job in queued if job.items]
            if extra:
                commands.append(["HSET", keys.chunks(name), *sum(extra, ())])
            ids = [job.execution_id for job in queued]
            push = ["LPUSH", queue_key, *reversed(ids)] if at_front else ["RPUSH", queue_key, *ids]
            commands.append(push)
        commands += self._group_commands(jobs)
        return commands

    def _group_commands(self, jobs: Sequence[NewJob]) -> list[list[Any]]:
        # Each group's members (its waiting jobs, and the sessions its cells ran in), before the
        # jobs can finish: a worker removes a job from its group when it answers it.
        members: dict[str, list[str]] = {}
        sessions: dict[str, list[str]] = {}
        for execution_id, payload in (member for job in jobs for member in job.members()):
            group = payload.group
            if group is None:
                continue
            members.setdefault(group, [keys.GROUP_USED]).append(execution_id)
            if payload.session_id is not None and not payload.end_session:
                sessions.setdefault(group, []).append(payload.session_id)
        commands: list[list[Any]] = []
        for group, ids in members.items():
            key = keys.group(self._name, group)
            commands += [["SADD", key, *ids], ["EXPIRE", key, self._group_ttl_s]]
        for group, session_ids in sessions.items():
            key = keys.group_sessions(self._name, group)
            commands += [["SADD", key, *session_ids], ["EXPIRE", key, self._group_ttl_s]]
        return commands

    def enqueue(self, jobs: Sequence[NewJob], at_front: bool = False) -> None:
        """Enqueue without an admission check (retries of already admitted work), in one MULTI.

        Jobs keep their order within each queue they go to.
        """
        with self._redis.pipeline(transaction=True) as pipe:
            for command in self._enqueue_commands(jobs, at_front):
                pipe.execute_command(*command)  # type: ignore[no-untyped-call]
            pipe.execute()

    def withdraw(
        self, execution_ids: Sequence[str], queues: Sequence[str] | None = None
    ) -> list[bool]:
        """Remove waiting jobs from their queues; True for each one removed (it will never run).

        A chunk's item withdraws its whole chunk (the calls of one chunk wait and are withdrawn
        together). `queues`: the RQ queue of each job, when known; else read from the job.
        """
        if not execution_ids:
            return []
        jobs = [job_of(execution_id) for execution_id in execution_ids]
        unique = list(dict.fromkeys(jobs))
        if queues is None:
            with self._redis.pipeline(transaction=False) as pipe:
                for job in unique:
                    pipe.hget(keys.rq_job(job), "origin")
                origins = [q.decode() if q else self._name for q in pipe.execute()]
        else:
            queue_of = dict(zip(jobs, queues, strict=True))
            origins = [queue_of[job] for job in unique]
        with self._redis.pipeline(transaction=False) as pipe:
            for job, queue in zip(unique, origins, strict=True):
                pipe.lrem(keys.rq_queue(queue), 0, job)
            removed = {job: bool(n) for job, n in zip(unique, pipe.execute(), strict=True)}
        gone = [job for job in unique if removed[job]]
        with self._redis.pipeline(transaction=False) as pipe:
            if gone:
                pipe.delete(*(keys.rq_job(job) for job in gone))
            # Not in its queue: it waits no more (even one whose worker died as it popped it).
            for job, queue in zip(unique, origins, strict=True):
                pipe.hdel(keys.chunks(queue), job)
            pipe.execute()
        return [removed[job] for job in jobs]

    def cancel(
        self,
        execution_ids: Sequence[str],
        marker_ttl_s: int,
        reason: str = CLIENT_LEFT,
        answer: bool = False,
    ) -> tuple[list[str], list[str]]:
        """Cancel these jobs (their clients went away, or their group was cancelled): drop the
        waiting ones, kill the running ones.

        Returns (dropped: removed from their queues, never run; signalled: their workers were
        told to kill them). The marker (its value: `reason`) is set first: a worker that
        dequeues one in between sees it in its prepare pipeline, which also names it as the
        job's worker, so every job is either dropped, skipped by its worker, or signalled.
        `answer`: someone still waits for them (a cancelled group), so a dropped job's
        `cancelled` result is delivered to its API, in the same script that drops it.
        """
        with self._redis.pipeline(transaction=False) as pipe:
            for execution_id in execution_ids:
                pipe.set(keys.cancelled(self._name, execution_id), reason, ex=marker_ttl_s)
            pipe.execute()
        if answer:
            removed = self._drop_answering(execution_ids, reason)
        else:
            removed = self.withdraw(execution_ids)
        started = [
            execution_id for execution_id, r in zip(execution_ids, removed, strict=True) if not r
        ]
        dropped = [
            execution_id for execution_id, r in zip(execution_ids, removed, strict=True) if r
        ]
        if not started:
            return dropped, []
        with self._redis.pipeline(transaction=False) as pipe:
            for execution_id in started:
                pipe.hget(keys.rq_job(job_of(execution_id)), "worker_name")
            workers = pipe.execute()
        signalled = []
        with self._redis.pipeline(transaction=False) as pipe:
            for execution_id, worker in zip(started, workers, strict=True):
                if worker:  # else finished meanwhile (its result has no reader left)
                    cancel_list = keys.cancel_list(self._name, worker.decode())
                    pipe.rpush(cancel_list, execution_id)
                    pipe.expire(cancel_list, self._result_ttl_s)
                    signalled.append(execution_id)
            pipe.execute()
        return dropped, signalled

    def _drop_answering(self, execution_ids: Sequence[str], reason: str) -> list[bool]:
        """Remove waiting jobs from their queues and answer them `cancelled`, each atomically
        (so the waiting API's watchdog never sees one gone without its result). A chunk is
        dropped only when all its calls are among `execution_ids`; else its worker skips them."""
        jobs = [job_of(execution_id) for execution_id in execution_ids]
        unique = list(dict.fromkeys(jobs))
        wanted = set(execution_ids)
        with self._redis.pipeline(transaction=False) as pipe:
            for job in unique:
                pipe.hmget(keys.rq_job(job), "origin", "data", "status")
            records = pipe.execute()
        queued: list[str] = []
        with self._redis.pipeline(transaction=False) as pipe:
            for job, (origin, data, status) in zip(unique, records, strict=True):
                if status != b"queued" or data is None:
                    continue  # started, finished or gone: its worker answers
                try:
                    wire = rq_format.job_args(data)[0]
                    chunk = chunk_from_wire(wire)
                    payloads = [JobPayload.from_wire(wire)] if chunk is None else []
                except (ValueError, KeyError, TypeError, IndexError):
                    continue
                if chunk is None:
                    members = [(job, payloads[0])]
                else:
                    members = [(item_id(job, i), item) for i, (item, _) in enumerate(chunk)]
                if not all(member in wanted for member, _ in members):
                    continue
                queue = origin.decode() if origin else self._name
                script_keys = [keys.rq_queue(queue), keys.rq_job(job), keys.chunks(queue)]
                argv: list[Any] = [job, self._result_ttl_s]
                for member, payload in members:
                    queue_time = time.time() - payload.admitted_at
                    result_json = encode_result(
                        failure_result(Status.CANCELLED, never_ran(reason), member, queue_time)
                    )
                    notice = encode_notice(member, result_json) if payload.reply_to else ""
                    group_key = keys.group(self._name, payload.group) if payload.group else ""
                    script_keys += [keys.result(self._name, member), payload.reply_to, group_key]
                    argv += [member, result_json, notice]
                self._drop_script(keys=script_keys, args=argv, client=pipe)
                queued.append(job)
            dropped = {job for job, ok in zip(queued, pipe.execute(), strict=True) if ok}
        return [job in dropped for job in jobs]

    def group_members(self, group_id: str) -> tuple[bool, list[str], list[str]]:
        """(whether the group was used, its jobs not yet answered, its sessions)."""
        with self._redis.pipeline(transaction=False) as pipe:
            pipe.smembers(keys.group(self._name, group_id))
            pipe.smembers(keys.group_sessions(self._name, group_id))
            members, sessions = pipe.execute()
        ids = sorted(m.decode() for m in members if m != keys.GROUP_USED.encode())
        return bool(members), ids, sorted(s.decode() for s in sessions)

    def leave_group(self, group_id: str, execution_ids: Sequence[str]) -> None:
        """These calls were cancelled with their group: a later cancel does not count them
        again while they die (their delivery leaves the group too)."""
        if execution_ids:
            self._redis.srem(keys.group(self._name, group_id), *execution_ids)

    def forget_group_sessions(self, group_id: str, session_ids: Sequence[str]) -> None:
        """The group's sessions were ended: drop them from its set."""
        if session_ids:
            self._redis.srem(keys.group_sessions(self._name, group_id), *session_ids)

    def forget(self, execution_ids: Sequence[str]) -> None:
        """Delete the records of lost jobs (a started job whose worker died stays "started")."""
        if execution_ids:
            jobs = list(dict.fromkeys(job_of(execution_id) for execution_id in execution_ids))
            with self._redis.pipeline(transaction=False) as pipe:
                for job in jobs:
                    pipe.hget(keys.rq_job(job), "origin")
                origins = [q.decode() if q else self._name for q in pipe.execute()]
            with self._redis.pipeline(transaction=False) as pipe:
                pipe.delete(*(keys.rq_job(job) for job in jobs))
                for job, queue in zip(jobs, origins, strict=True):
                    pipe.hdel(keys.chunks(queue), job)
                pipe.execute()

    def inspect(self, execution_ids: Sequence[str], alive_since: float) -> list[JobState]:
        """The state of each job; workers whose last heartbeat is before alive_since are dead."""
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.zrangebyscore(keys.alive(self._name), alive_since, "+inf")
            for execution_id in execution_ids:
                pipe.hmget(keys.rq_job(job_of(execution_id)), "status", "worker_name", "origin")
                pipe.get(keys.result(self._name, execution_id))
            replies = pipe.execute()
        live = {name.decode() for name in replies[0]}
        states: list[JobState] = []
        for i in range(len(execution_ids)):
            (status, worker, origin), raw = replies[1 + 2 * i], replies[2 + 2 * i]
            states.append(self._classify(status, worker, origin, raw, live))
        return states

    def _classify(
        self,
        status: bytes | None,
        worker: bytes | None,
        origin: bytes | None,
        raw: bytes | None,
        live: set[str],
    ) -> JobState:
        if raw is not None:
            return JobState("done", result=json.loads(raw))
        name = worker.decode() if worker else ""
        queue = origin.decode() if origin else self._name
        if status == b"queued":
            owner = keys.queue_worker(self._name, queue)
            stranded = owner is not None and owner not in live
            return JobState("stranded" if stranded else "queued", queue=queue)
        if status == b"started":
            return JobState("running" if name in live else "lost", worker=name, queue=queue)
        # Gone without a result (Redis lost it), or failed/stopped by RQ's own maintenance.
        return JobState("lost", worker=name, queue=queue)


def next_cancelled(
    connection: redis.Redis, queue_name: str, worker: str, block_s: float
) -> str | None:
    """The next job this worker must kill (its client went away), waiting up to block_s."""
    popped = connection.blpop([keys.cancel_list(queue_name, worker)], timeout=block_s)
    if popped is None:
        return None
    execution_id = popped[1]
    return execution_id.decode() if isinstance(execution_id, bytes) else str(execution_id)


class JobHandler(Protocol):
    """What a LeanWorker runs for each job."""

    def run(self, execution_id: str, payload: JobPayload) -> ResultDict:
        """Run the job; every failure comes back as a result, never an exception."""
        ...

    def abandon(self, execution_id: str, payload: JobPayload, reason: str) -> ResultDict:
        """The run was interrupted (time budget exceeded): reset, and say sandbox_error."""
        ...


class DequeuedJob(Job):
    """An RQ job as a LeanWorker dequeues it: its fields are read by PREPARE_SCRIPT, with its start.

    RQ's Job.fetch reads the whole hash (HGETALL) and parses five dates with strptime, a round
    trip and about a tenth of the worker's CPU per job (scripts/profile_worker.py). A LeanWorker
    needs the payload and the timeout; the rest is restored as RQ's defaults. Only the dequeue
    uses this class (LeanQueue): RQ's maintenance fetches whole jobs, as it may save them back.
    """

    FIELDS = ("data", "origin", "timeout", "description", "status")

    def refresh(self) -> None:
        """Nothing: LeanWorker.execute_job reads the fields in its prepare round trip."""

    def restore_fields(self, values: Sequence[bytes | None]) -> None:
        """Restore from the values of FIELDS (PREPARE_SCRIPT's reply)."""
        self.restore({f: v for f, v in zip(self.FIELDS, values, strict=True) if v is not None})


_FIELD_NAMES = ", ".join(f"'{name}'" for name in DequeuedJob.FIELDS)
PREPARE_SCRIPT = (
    """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local i = 1
while i <= #ARGV do
  local nargs = tonumber(ARGV[i])
  redis.call(unpack(ARGV, i + 1, i + nargs))
  i = i + 1 + nargs
end
local fields = redis.call('HMGET', KEYS[1], """
    + _FIELD_NAMES
    + """)
return {fields, redis.call('GET', KEYS[2]), redis.call('GET', KEYS[3])}
"""
)
"""A dequeued job's start in one round trip (KEYS: the job hash, its cancel marker, the cancel
marker of its first call if it is a chunk; ARGV: RQ's own commands that mark it started by this
worker, and the HDEL of its waiting chunk's count, counted as in ADMIT_SCRIPT). Returns its
fields and both cancel markers (the reason, or false), or false when the job hash is gone
(nothing is written then). The markers are read after the worker name is set (see
JobQueue.cancel)."""

DROP_SCRIPT = """
if redis.call('LREM', KEYS[1], 0, ARGV[1]) == 0 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HDEL', KEYS[3], ARGV[1])
for i = 0, (#KEYS - 3) / 3 - 1 do
  local k, a = 4 + 3 * i, 3 + 3 * i
  redis.call('SET', KEYS[k], ARGV[a + 1], 'EX', ARGV[2])
  if KEYS[k + 1] ~= '' then
    redis.call('RPUSH', KEYS[k + 1], ARGV[a + 2])
    redis.call('EXPIRE', KEYS[k + 1], ARGV[2])
  end
  if KEYS[k + 2] ~= '' then redis.call('SREM', KEYS[k + 2], ARGV[a]) end
end
return 1
"""
"""Drop one waiting job and answer each of its calls (KEYS: its queue's list, its hash, the
chunks hash, then per call: its result key, its API's reply list or '', its group's set or '';
ARGV: the job id, the TTL, then per call: its id, the result JSON, the notice): 1 when it was
still waiting, else 0 and nothing is written (a worker has it)."""


DELIVER_SCRIPT = """
local ttl, n = ARGV[1], tonumber(ARGV[2])
local notices = {}
for r = 0, n - 1 do
  local k, a = 4 + 2 * r, 3 + 3 * r
  redis.call('SET', KEYS[k], ARGV[a], 'EX', ttl)
  if ARGV[a + 1] ~= '' then notices[#notices + 1] = ARGV[a + 1] end
  if KEYS[k + 1] ~= '' then redis.call('SREM', KEYS[k + 1], ARGV[a + 2]) end
end
if KEYS[3] ~= '' and #notices > 0 then
  redis.call('RPUSH', KEYS[3], unpack(notices))
  redis.call('EXPIRE', KEYS[3], ttl)
end
if KEYS[1] ~= '' then redis.call('DEL', KEYS[1]) end
redis.call('HINCRBY', KEYS[2], 'successful_job_count', n)
local markers = {}
for k = 4 + 2 * n, #KEYS do markers[#markers + 1] = redis.call('GET', KEYS[k]) or '' end
return markers
"""
"""Calls' results, atomically (KEYS: the job hash or '' (a chunk's calls before its last), the
worker hash, the reply list or '', then per call its result key and its group's set or '',
then cancel markers to read; ARGV: the results' TTL, the number of calls, then per call its
result JSON, its notice or '' and its id): store each, notify the waiter, leave the groups,
delete the job hash, count them; returns the markers' reasons ('' for none), in order."""


TAKE_SCRIPT = """
for i, key in ipairs(KEYS) do
  local id = redis.call('LPOP', key)
  if id then return {i, id} end
end
return false
"""
"""The first job waiting in the queues KEYS, in order, popped: {its queue's index, its id}."""


class LeanQueue(Queue):
    """RQ's Queue whose dequeue hands out DequeuedJob (read later, in the prepare round trip)."""

    @classmethod
    def dequeue_any(cls, *args: Any, **kwargs: Any) -> tuple[Job, Queue] | None:
        kwargs["job_class"] = DequeuedJob
        dequeued: tuple[Job, Queue] | None = super().dequeue_any(*args, **kwargs)
        return dequeued


class LeanWorker(SimpleWorker):
    """RQ's SimpleWorker with two scripts per job instead of ~70 commands (see module doc)."""

    suspension_check_interval_s = 1.0
    heartbeat_interval_s = 10.0
    max_connection_wait_time = 2.0
    """Cap of RQ's reconnect backoff, so workers resume quickly once Redis is back."""

    def __init__(
        self,
        handler: JobHandler,
        queue_name: str,
        result_ttl_s: int,
        own_queue: str | None = None,
        tenant_weights: Mapping[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        self._own_queue = own_queue
        self._queue_name = queue_name
        # Fixed weights (tests, scripts) or those the API publishes, re-read while idle.
        self._follows_published = tenant_weights is None
        weights = dict(tenant_weights or {})
        if self._follows_published:
            with contextlib.suppress(redis.RedisError):
                weights = read_tenant_weights(kwargs["connection"], queue_name)
        self._weights = weights or {"default": 1.0}
        self._tenants_read_at = time.monotonic()
        super().__init__(
            self._queue_names(), serializer=JSONSerializer, queue_class=LeanQueue, **kwargs
        )
        self._fair = FairOrder(self._shares())
        self._queue_by_name = {queue.name: queue for queue in self.queues}
        self._dequeued_from_one = len(self.queues) == 1
        self._handler = handler
        self._result_ttl_s = result_ttl_s
        self._suspension_checked_at = 0.0
        self._heartbeat_at = 0.0
        self._prepare_script = self.connection.register_script(PREPARE_SCRIPT)
        self._deliver_script = self.connection.register_script(DELIVER_SCRIPT)
        self._take_script = self.connection.register_script(TAKE_SCRIPT)
        self._between_calls = False
        """A job taken between a chunk's calls runs now (it takes none itself)."""

    def _shares(self) -> dict[str, float]:
        shares = {keys.tenant_queue(self._queue_name, t): w for t, w in self._weights.items()}
        if self._own_queue:
            shares = {self._own_queue: sum(self._weights.values()), **shares}
        return shares

    def _queue_names(self) -> list[str]:
        return list(self._shares())

    @property
    def dequeue_timeout(self) -> int:
        """Seconds one blocking dequeue waits: short, so that an idle worker picks up a new
        tenant's queue soon after an API publishes it."""
        return math.ceil(TENANTS_REFRESH_S)

    def _refresh_tenants(self) -> None:
        """Re-read the published tenants (every TENANTS_REFRESH_S) and listen to their queues."""
        now = time.monotonic()
        if not self._follows_published or now - self._tenants_read_at < TENANTS_REFRESH_S:
            return
        self._tenants_read_at = now
        weights = read_tenant_weights(self.connection, self._queue_name)
        if not weights or weights == self._weights:
            return  # nothing published (Redis restarted): keep serving what we know
        self._weights = weights
        self._fair = FairOrder(self._shares())
        self.queues = [
            self._queue_by_name.get(name)
            or self.queue_class(
                name=name,
                connection=self.connection,
                job_class=self.job_class,
                serializer=self.serializer,
            )
            for name in self._queue_names()
        ]
        self._queue_by_name = {queue.name: queue for queue in self.queues}
        self._ordered_queues = [self._queue_by_name[name] for name in self._fair.order()]
        log.info("worker serves tenants", extra=fields(worker=self.name, tenants=weights))

    def reorder_queues(self, reference_queue: Queue) -> None:
        """After a job from `reference_queue`: the queues in fair-share order (module doc)."""
        # RQ moves a job into an intermediate list (BLMOVE) only when it listens on one queue.
        self._dequeued_from_one = len(self._ordered_queues) == 1
        self._fair.served(reference_queue.name)
        self._ordered_queues = [self._queue_by_name[name] for name in self._fair.order()]

    # RQ calls these several times per job, each a round trip; rate-limit them.
    def set_state(self, state: str, pipeline: Any = None) -> None:
        self._state = state
        if pipeline is not None or state not in (WorkerStatus.IDLE, WorkerStatus.BUSY):
            super().set_state(state, pipeline=pipeline)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is None and self._state == WorkerStatus.IDLE:
            self._refresh_tenants()  # RQ beats before each blocking dequeue
        now = time.monotonic()
        if (
            pipeline is None
            and timeout is None
            and now - self._heartbeat_at < self.heartbeat_interval_s
        ):
            return
        self._heartbeat_at = now
        if pipeline is not None:
            super().heartbeat(timeout, pipeline=pipeline)
            return
        with self.connection.pipeline(transaction=False) as pipe:
            super().heartbeat(timeout, pipeline=pipe)
            pipe.execute()

    def check_for_suspension(self, burst: bool) -> None:
        now = time.monotonic()
        if now - self._suspension_checked_at >= self.suspension_check_interval_s:
            self._suspension_checked_at = now
            super().check_for_suspension(burst)

    def unsubscribe(self) -> None:
        """RQ's unsubscribe, without its wait of up to a minute at shutdown.

        RQ unsubscribes, then stops its pubsub thread, and redis-py 8's stop() joins that
        thread: one that read the unsubscribe reply before it was told to stop goes on to wait
        for a new subscription for its whole sleep time (RQ's 60 s), past the supervisor's
        grace, which then kills the worker. Told to stop first, the thread ends with the read of
        that reply; one already waiting (after a reconnection) is left behind after a second, a
        daemon thread that ends with the process.
        """
        thread, pubsub = self.pubsub_thread, self.pubsub
        if thread is None or pubsub is None:
            return
        thread.stop(timeout=0)
        try:
            pubsub.unsubscribe()
        except (redis.RedisError, OSError):
            log.warning("could not unsubscribe the worker's channel", exc_info=True)
        thread.join(timeout=1)
        pubsub.close()

    def execute_job(self, job: Job, queue: Queue) -> None:
        # BUSY first: RQ's SIGTERM handler then waits for this job (warm shutdown).
        self._state = WorkerStatus.BUSY
        reply_to = ""
        group = ""
        try:
            markers = self._start(job, queue)
            if markers is None:  # deleted after its dequeue (RQ's fetch would skip it too)
                log.warning("job vanished before it started", extra=fields(execution_id=job.id))
                return
            cancelled, first_cancelled = markers
            reply_to = JobPayload.reply_to_of(job.args[0])
            chunk = chunk_from_wire(job.args[0], dequeued_at=time.time())
            if chunk is not None:
                self._charge_chunk(queue, len(chunk))
                self._run_chunk(job, chunk, reply_to, first_cancelled, queue.name)
                return
            payload = JobPayload.from_wire(job.args[0])
            group = keys.group(self._queue_name, payload.group) if payload.group else ""
            if cancelled:
                log.info("job cancelled before it started", extra=fields(execution_id=job.id))
                result = failure_result(Status.CANCELLED, never_ran(cancelled), job.id)
                self._deliver_one(job, reply_to, result, group)
                return
            try:
                with self.death_penalty_class(job.timeout, JobTimeoutException, job_id=job.id):
                    result = self._handler.run(job.id, payload)
            except JobTimeoutException:
                result = self._handler.abandon(job.id, payload, "the job exceeded its time budget")
            self._deliver_one(job, reply_to, result, group)
        except redis.RedisError:
            # The API's watchdog answers for this job (retry or sandbox_error).
            log.exception("redis failed around job %s", job.id)
        except Exception as exc:  # a bad payload or a bug: answer, never leave the job hanging
            log.exception("job %s failed in the worker", job.id)
            with contextlib.suppress(redis.RedisError):
                error = failure_result(Status.SANDBOX_ERROR, f"worker error: {exc}", job.id)
                self._deliver_one(job, reply_to, error, group)
        finally:
            self._state = WorkerStatus.IDLE

    def _charge_chunk(self, queue: Queue, calls: int) -> None:
        """Fair share counts calls: a chunk's calls beyond its first (reorder_queues charged
        the job) move its queue back in the order for the next dequeue."""
        self._fair.served_more(queue.name, calls - 1)
        self._ordered_queues = [self._queue_by_name[name] for name in self._fair.order()]

    def _run_chunk(
        self,
        job: Job,
        chunk: list[tuple[JobPayload, float]],
        reply_to: str,
        cancelled: str,
        queue_name: str = "",
    ) -> None:
        """Run a chunk's calls in turn, each under its own budget, delivering their results a
        few at a time (outbox.py); a call cancelled meanwhile (its marker, read with a delivery,
        or the worker's cancel list) is answered `cancelled` without running. Dequeued in time,
        no call of it is late (chunk_from_wire). Before each call after the first, a job
        waiting ahead of the chunk's queue `queue_name` in the fair order runs first."""
        last = len(chunk) - 1
        markers = {0: cancelled} if cancelled else {}
        outbox = Outbox()
        with CallAlarm() as alarm:
            for i, (payload, budget_s) in enumerate(chunk):
                if i > 0 and queue_name and self._serve_one_ahead_of(queue_name):
                    alarm.reinstall()  # the job run ahead installed and removed its own
                execution_id = item_id(job.id, i)
                started = time.monotonic()
                if i in markers:
                    log.info("call cancelled before it started", extra=fields(call=execution_id))
                    result = failure_result(Status.CANCELLED, never_ran(markers[i]), execution_id)
                else:
                    result = self._run_call(execution_id, payload, budget_s, alarm)
                group = keys.group(self._queue_name, payload.group) if payload.group else ""
                now = time.monotonic()
                outbox.add(self._delivery(execution_id, result, reply_to, group), now)
                if outbox.due(now, now - started, i == 0, i == last):
                    behind = [item_id(job.id, k) for k in range(i + 1, len(chunk))]
                    reasons = self._deliver(job if i == last else None, reply_to, outbox, behind)
                    markers.update((i + 1 + k, r) for k, r in enumerate(reasons) if r)

    def _serve_one_ahead_of(self, queue_name: str) -> bool:
        """Run one job waiting in a queue ahead of `queue_name` in the fair order, if any;
        whether one ran."""
        if self._between_calls:
            return False
        ahead: list[Queue] = []
        for name in self._fair.order():
            if name == queue_name:
                break
            ahead.append(self._queue_by_name[name])
        if not ahead:
            return False
        try:
            taken = self._take_script(keys=[queue.key for queue in ahead])
        except redis.RedisError:
            log.warning("could not look for calls waiting ahead of a chunk", exc_info=True)
            return False
        if not taken:
            return False
        index, job_id = taken
        queue = ahead[int(index) - 1]
        job = DequeuedJob.fetch(
            _reason(job_id), connection=self.connection, serializer=self.serializer
        )
        self._between_calls = True
        try:
            self.reorder_queues(queue)
            self.execute_job(job, queue)
        finally:
            self._between_calls = False
            self._state = WorkerStatus.BUSY  # the chunk runs on
        return True

    def _run_call(
        self, execution_id: str, payload: JobPayload, budget_s: float, alarm: CallAlarm
    ) -> ResultDict:
        try:
            alarm.arm(budget_s, execution_id)
            try:
                return self._handler.run(execution_id, payload)
            finally:
                alarm.disarm()
        except JobTimeoutException:
            return self._handler.abandon(execution_id, payload, "the job exceeded its time budget")
        except Exception as exc:  # a bug: answer this call, go on with the next
            log.exception("call %s failed in the worker", execution_id)
            return failure_result(Status.SANDBOX_ERROR, f"worker error: {exc}", execution_id)

    def _start(self, job: Job, queue: Queue) -> tuple[str, str] | None:
        """Mark the job started by this worker and read it; its cancel reason and its first
        call's if it is a chunk ("" when not cancelled), or None when its hash is gone."""
        # RQ's own commands, recorded on a pipeline that is never sent (as in admission).
        record = self.connection.pipeline(transaction=False)
        try:
            job.prepare_for_execution(self.name, pipeline=record)
            if self._dequeued_from_one:
                record.lrem(queue.intermediate_queue_key, 1, job.id)
            record.hdel(keys.chunks(queue.name), job.id)
            argv: list[Any] = []
            for args, _ in record.command_stack:
                argv.append(len(args))
                argv.extend(args)
        finally:
            record.reset()
        cancel_marker = keys.cancelled(self._queue_name, job.id)
        first_marker = keys.cancelled(self._queue_name, item_id(job.id, 0))
        reply = self._prepare_script(keys=[job.key, cancel_marker, first_marker], args=argv)
        if not reply:
            return None
        values, cancelled, first_cancelled = reply
        if isinstance(job, DequeuedJob):
            job.restore_fields(values)
        return _reason(cancelled), _reason(first_cancelled)

    def _delivery(
        self, execution_id: str, result: ResultDict, reply_to: str, group: str
    ) -> Delivery:
        result_json = encode_result(result)
        notice = encode_notice(execution_id, result_json) if reply_to else ""
        return Delivery(execution_id, result_json, notice, group)

    def _deliver_one(self, job: Job, reply_to: str, result: ResultDict, group: str = "") -> None:
        """Deliver the result of a job of one call."""
        outbox = Outbox()
        outbox.add(self._delivery(job.id, result, reply_to, group), 0.0)
        self._deliver(job, reply_to, outbox, [])

    def _deliver(
        self, job: Job | None, reply_to: str, outbox: Outbox, behind: Sequence[str]
    ) -> list[str]:
        """Deliver the outbox's results (with `job`: the last of its job, whose hash goes);
        the cancel reasons of the calls `behind` ("" for none), in order."""
        deliveries = outbox.take()
        script_keys = [job.key if job is not None else "", self.key, reply_to]
        args: list[Any] = [self._result_ttl_s, len(deliveries)]
        for delivery in deliveries:
            script_keys += [keys.result(self._queue_name, delivery.execution_id), delivery.group]
            args += [delivery.result_json, delivery.notice, delivery.execution_id]
        script_keys += [keys.cancelled(self._queue_name, call) for call in behind]
        reasons = self._deliver_script(keys=script_keys, args=args)
        return [_reason(reason) for reason in reasons]


class CallAlarm:
    """The time budget of a chunk's calls: SIGALRM's handler installed once for the chunk (and
    again after a job run between two calls, whose death penalty installs and removes its own),
    the timer armed per call."""

    def __init__(self) -> None:
        self._call = ""

    def __enter__(self) -> CallAlarm:
        self.reinstall()
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    def reinstall(self) -> None:
        """Make this alarm SIGALRM's handler."""
        signal.signal(signal.SIGALRM, self._expired)

    def arm(self, budget_s: float, call: str) -> None:
        """JobTimeoutException in this (the main) thread once `budget_s` has passed."""
        self._call = call
        signal.setitimer(signal.ITIMER_REAL, max(budget_s, 0.001))

    def disarm(self) -> None:
        """Stop the timer (call it in a finally after arm)."""
        with contextlib.suppress(JobTimeoutException):  # it fired as the call returned
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _expired(self, signum: int, frame: object) -> None:
        raise JobTimeoutException(f"call {self._call} exceeded its time budget")


def _reason(marker: object) -> str:
    """A cancel marker's reason as the scripts return it ("" for none)."""
    if not marker:
        return ""
    return marker.decode() if isinstance(marker, bytes) else str(marker)


def work(
    connection: redis.Redis,
    queue_name: str,
    worker_name: str,
    handler: JobHandler,
    result_ttl_s: int,
    own_queue: str | None = None,
    tenant_weights: Mapping[str, float] | None = None,
) -> None:
    """Run the worker loop until SIGTERM/SIGINT; rides out Redis outages with backoff.

    `own_queue`: this worker's own queue (session cells), served in turn with the shared ones;
    `tenant_weights`: the tenants whose shared queues it serves, by weight (None: "default").
    """
    backoff_s = 0.5
    while True:
        # A previous incarnation that lost Redis never registered its death; drop its record.
        with contextlib.suppress(redis.RedisError):
            connection.delete(f"{SimpleWorker.redis_worker_namespace_prefix}{worker_name}")
        worker = LeanWorker(
            handler,
            queue_name,
            result_ttl_s,
            own_queue,
            tenant_weights,
            connection=connection,
            name=worker_name,
            worker_ttl=WORKER_TTL_S,
        )
        started = time.monotonic()
        try:
            # Fair share (reorder_queues): no queue starves another on a busy worker.
            worker.work(
                logging_level=None,
                max_idle_time=None,
                dequeue_strategy=DequeueStrategy.ROUND_ROBIN,
            )
        except redis.RedisError:
            log.warning("worker %s lost redis", worker_name)
        if worker._shutdown_requested_date is not None:
            return
        if time.monotonic() - started > 30:
            backoff_s = 0.5
        log.warning("worker %s loop ended; restarting in %.1fs", worker_name, backoff_s)
        try:
            time.sleep(backoff_s)
        except (StopRequested, SystemExit):
            return  # RQ's signal handlers are still installed and raise these
        backoff_s = min(backoff_s * 2, 5.0)
