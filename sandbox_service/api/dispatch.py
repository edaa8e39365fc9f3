"""The API's execution core: admit a group of jobs whole or not at all, then await their results.

Errors of the service itself (a program's failure is a result, never one of these):

    DispatchError
    ├── Overloaded   the queue is at its bound: 429 with Retry-After; nothing was enqueued
    │   └── OverRecorded  a session's recorded bytes at their bound (422), or its tenant's (429)
    └── Unavailable  Redis unreachable, or the process is shutting down: 503 with the reason

Admission is batched: one task collects every group waiting to be admitted and sends them all in
one Lua script (jobqueue.ADMIT_SCRIPT) that checks the queue depth and enqueues each group that
fits: one round trip for any number of requests, from the event loop (no thread hop on the hot
path) on a connection the admission task holds (held_connection.py), and the bound is exact
across replicas. The enqueue commands are built on the loop for a small round and in a thread for
a large one (a 1,024-request batch costs about 12 milliseconds).

Tenants (tenancy.py): each tenant's stateless jobs go to its own shared queue (workers take them
in proportion to the tenants' weights, worker/fair_share.py), which may hold at most the tenant's
share of the bound (max_queue_depth x weight / total weight), so that a flooding tenant never
fills the queue for the others. A tenant with `max_in_flight` has its admitted, unanswered jobs
counted in Redis (checked in the same script; released when `submit` ends, whichever way it
ends), and one with `max_sessions` its live sessions (quotas.py); when tenants share the cluster,
each tenant's live sessions are also bounded by its weight's share of the live workers' session
slots (a new session or fork past it never evicts another tenant's). Over any of these: 429.
A request with session cells first reads the recorded bytes of those sessions and of its tenant
(session_store.recorded_usage) and is refused when a cell's record would take one past its bound
(checked before admission, not atomically with it: concurrent cells may each pass once).

A round with session cells first routes them (one more round trip): each goes to the own queue of
its session's owner, claimed in Redis (session_store.py). The bound counts the shared queue and
the workers' own queues together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from redis.exceptions import RedisError

from sandbox_service import keys
from sandbox_service.api.awaiting import Awaiter
from sandbox_service.api.chunking import plan_chunks
from sandbox_service.broker import jobqueue, quotas, worker_stats
from sandbox_service.broker.held_connection import HeldConnection
from sandbox_service.broker.jobqueue import GroupBounds, JobQueue, NewJob
from sandbox_service.broker.liveness import Liveness
from sandbox_service.broker.session_store import (
    SessionStore,
    estimated_record_bytes,
    recorded_usage,
)
from sandbox_service.broker.worker_stats import WorkerStats
from sandbox_service.cancel import GROUP_CANCELLED
from sandbox_service.jobs import NO_SESSION, JobPayload, ResultDict, item_id
from sandbox_service.logs import fields
from sandbox_service.settings import Settings
from sandbox_service.tenancy import Tenant, tenant_var, unscoped

log = logging.getLogger(__name__)

ADMISSION_ROUND_MAX_JOBS = 8192
"""Most jobs one admission round enqueues (one script call)."""
WORKERS_FRESH_S = 1.0
"""How long the count of live workers that sizes a batch's chunks is reused."""
BUILD_ON_LOOP_MAX_JOBS = 64
"""Rounds up to this many jobs build their enqueue commands on the event loop (11 to 16 us per job
here, so under 1 ms of the loop; a thread hop costs about 0.1 ms of CPU); larger ones in a
thread, so that the loop keeps serving meanwhile."""


@dataclass(frozen=True, slots=True)
class GroupCancel:
    """What cancelling a group did."""

    cancelled: int
    """Calls dropped from the queue or killed while running."""
    sessions: int
    """Sessions ended."""


def group_ttl_s(settings: Settings) -> int:
    """How long a group is remembered after its last admission: a session of it may live that
    long, and a call wait that long."""
    return settings.session_ttl_s + int(settings.api_wait_s(settings.max_timeout)) + 1


class DispatchError(Exception):
    """The service could not take the request (see the module doc for the hierarchy)."""


class Overloaded(DispatchError):
    """The queue is full, or the tenant is over one of its quotas (`reason`)."""

    def __init__(self, message: str, reason: str = "queue_full") -> None:
        super().__init__(message)
        self.reason = reason
        """`queue_full`, `in_flight_quota` or `session_quota` (the metric's label)."""


class OverRecorded(Overloaded):
    """A session cell would take its session's or its tenant's recorded bytes past their bound:
    422 for a session (it never fits), 429 for a tenant (until its sessions end or expire)."""

    def __init__(self, message: str, per_session: bool) -> None:
        super().__init__(message, "session_recorded_bytes" if per_session else "recorded_bytes")
        self.status_code = 422 if per_session else 429


class Unavailable(DispatchError):
    """Redis is unreachable or the server is shutting down."""


class Dispatcher:
    """Admits requests into the queue and resolves their results, for one API process."""

    def __init__(self, settings: Settings) -> None:
        if settings.redis_url is None:
            raise ValueError("the API needs a Redis: set RL_SANDBOX_REDIS_URL (or REDIS_URL)")
        self.settings = settings
        self.api_id = uuid.uuid4().hex
        self.draining = False
        self.retries = 0
        self.cancelled_dropped = 0
        """Abandoned jobs removed from the queue before they started."""
        self.cancelled_killed = 0
        """Abandoned jobs whose worker was told to kill them (or to skip them at their start)."""
        self._cancelling: set[asyncio.Task[None]] = set()
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="redis")
        connection = jobqueue.connect(settings.redis_url)
        self._job_queue = JobQueue(
            connection, settings.queue_name, settings.result_ttl_s, group_ttl_s(settings)
        )
        self.sessions = SessionStore.for_settings(connection, settings)
        self.redis = jobqueue.connect_async(settings.redis_url)
        self._listen_redis = jobqueue.connect_async(settings.redis_url)
        self.awaiter = Awaiter(
            settings,
            keys.reply(settings.queue_name, self.api_id),
            self._job_queue,
            self._run_sync,
            self._listen_redis,
            self.redis,
            route=self.route,
            on_retry=self._count_retry,
        )
        self._admission_connection = HeldConnection(self.redis)
        self._depth_script = self.redis.register_script(jobqueue.DEPTH_SCRIPT)
        self._to_admit: asyncio.Queue[tuple[list[NewJob], GroupBounds, asyncio.Future[int]]] = (
            asyncio.Queue()
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._workers_seen = 0
        self._workers_seen_at = -math.inf
        tenants = settings.tenants()
        total_weight = sum(t.weight for t in tenants)
        self._bounds = {
            t.name: self._tenant_bounds(t, len(tenants) > 1, total_weight) for t in tenants
        }
        self._session_fraction = (
            {t.name: t.weight / total_weight for t in tenants} if len(tenants) > 1 else {}
        )
        """Tenant -> its weight's fraction of the cluster's live-session slots, when tenants share
        the cluster (one tenant alone is bounded by the slots themselves)."""
        self._tenant_queues = [
            b.tenant_queue for b in self._bounds.values() if b.tenant_queue != settings.queue_name
        ]
        self._in_flight = quotas.InFlightRelease(self.redis)

    def _tenant_bounds(self, tenant: Tenant, shared: bool, total_weight: float) -> GroupBounds:
        queue = self.settings.queue_name
        share = self.settings.max_queue_depth * tenant.weight / total_weight
        return GroupBounds(
            tenant_queue=keys.tenant_queue(queue, tenant.name),
            queue_share=max(1, int(share)) if shared else None,
            in_flight_key=keys.in_flight(queue, tenant.name) if tenant.max_in_flight else "",
            max_in_flight=tenant.max_in_flight or 0,
        )

    def _bounds_of(self, tenant: Tenant) -> GroupBounds:
        found = self._bounds.get(tenant.name)
        if found is None:  # a tenant this process was not configured with: no share of it
            raise Unavailable(f"tenant {tenant.name!r} is not configured on this server")
        return found

    def same_cell(self, session_id: str, other: str) -> bool:
        """Whether two sessions live in the same cell: always, in one cell (see cells.py)."""
        return True

    def _count_retry(self) -> None:
        self.retries += 1

    async def _run_sync(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def start(self) -> None:
        """Publish the tenants for the workers; start the admission, listener and watchdog
        tasks."""
        weights = {t.name: t.weight for t in self.settings.tenants()}
        with contextlib.suppress(RedisError, OSError):  # else the publisher's next round
            await quotas.publish_tenants(
                self.redis, keys.tenants(self.settings.queue_name), weights
            )
        self._tasks = [
            asyncio.create_task(self._admit_loop(), name="admission"),
            asyncio.create_task(self.awaiter.listen(), name="reply-listener"),
            asyncio.create_task(self.awaiter.watch(), name="watchdog"),
            asyncio.create_task(self._in_flight.run(), name="in-flight-release"),
            asyncio.create_task(
                quotas.keep_published(self.redis, keys.tenants(self.settings.queue_name), weights),
                name="tenants-publisher",
            ),
        ]

    async def stop(self) -> None:
        """Stop the tasks; requests still waiting get sandbox_error."""
        self.draining = True
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.awaiter.fail_all("the server is shutting down")
        if self._cancelling:  # abandoned work still to cancel: do not leave it running
            await asyncio.wait(self._cancelling, timeout=5.0)
        with contextlib.suppress(RedisError, OSError):
            await self._in_flight.flush()
        await self._admission_connection.release()
        await self.awaiter.release()
        await self.redis.aclose()
        await self._listen_redis.aclose()
        self._threads.shutdown(wait=False, cancel_futures=True)

    @property
    def in_flight(self) -> int:
        """Jobs this process waits for."""
        return len(self.awaiter.outstanding.jobs)

    async def submit(self, payloads: Sequence[JobPayload]) -> list[ResultDict]:
        """Run the payloads (all admitted or none) and return their results in order."""
        if self.draining:
            raise Unavailable("the server is shutting down")
        tenant = tenant_var.get()
        admitted_at = time.time()
        bounds = self._bounds_of(tenant)
        workers = await self._workers_for_chunks(len(payloads))
        await self._check_recorded_bytes(tenant, payloads)
        new_sessions = await self._claim_sessions(tenant, payloads, admitted_at)
        plan = plan_chunks(payloads, workers)
        stamped = _stamped(payloads, plan, self.awaiter_reply_key, admitted_at, self.settings)
        # Stateless work (chunks included) waits on the tenant's shared queue.
        queue = "" if bounds.tenant_queue == self.settings.queue_name else bounds.tenant_queue
        jobs: list[NewJob] = []
        slots: list[asyncio.Future[ResultDict] | None] = [None] * len(stamped)
        execution_ids: list[str] = []
        longest_behind_s = 0.0
        for indices in plan:
            job_id = uuid.uuid4().hex
            if len(indices) == 1:
                (i,) = indices
                slots[i] = self.awaiter.track(job_id, stamped[i], queue)
                execution_ids.append(job_id)
                job = NewJob.of(job_id, stamped[i], self.settings)
                jobs.append(replace(job, queue=queue) if queue else job)
                continue
            # A call's wait grows by the budgets of the calls before it in the chunk.
            items = [stamped[i] for i in indices]
            budgets = [item.worker_budget_s(self.settings) for item in items]
            before_s = 0.0
            for k, (i, item) in enumerate(zip(indices, items, strict=True)):
                slots[i] = self.awaiter.track(item_id(job_id, k), item, queue, behind_s=before_s)
                execution_ids.append(item_id(job_id, k))
                longest_behind_s = max(longest_behind_s, before_s)
                before_s += budgets[k]
            jobs.append(NewJob.chunk(job_id, items, self.settings, budgets, queue))
        futures = [future for future in slots if future is not None]
        if bounds.in_flight_key:
            # Each call counts in flight until the latest a call of this request may wait.
            wait_s = self.settings.api_wait_s(self.settings.max_timeout) + longest_behind_s
            bounds = replace(bounds, expires_at=admitted_at + wait_s)
        admission = self._request_admission(jobs, bounds)
        try:
            verdict = await asyncio.shield(admission)
        except asyncio.CancelledError:
            # The client went away during admission: cancel the jobs if they were admitted.
            admission.add_done_callback(
                lambda done: self._abandon_if_admitted(done, futures, bounds, execution_ids)
            )
            raise
        except BaseException:
            self.awaiter.outstanding.discard(execution_ids)
            await self._unclaim_sessions(tenant, new_sessions)
            raise
        if verdict != jobqueue.ADMITTED:
            self.awaiter.outstanding.discard(execution_ids)
            await self._unclaim_sessions(tenant, new_sessions)
            raise self._refusal(verdict, tenant, bounds)
        self.awaiter.mark_admitted(execution_ids)
        try:
            return list(await asyncio.gather(*futures))
        except asyncio.CancelledError:
            self.abandon(futures)
            raise
        finally:
            # The one place an admitted call ends: answered (result, queue_timeout, lost
            # worker, deadline) or abandoned (client gone, cancelled).
            self._in_flight.release(bounds.in_flight_key, execution_ids)

    def _refusal(self, verdict: int, tenant: Tenant, bounds: GroupBounds) -> Overloaded:
        if verdict == jobqueue.TENANT_QUEUE_FULL:
            return Overloaded(
                f"tenant {tenant.name!r} has its share of the queue waiting "
                f"({bounds.queue_share} calls)"
            )
        if verdict == jobqueue.IN_FLIGHT_QUOTA:
            return Overloaded(
                f"tenant {tenant.name!r} has its quota of calls in flight ({tenant.max_in_flight})",
                "in_flight_quota",
            )
        return Overloaded(f"the queue is full ({self.settings.max_queue_depth} jobs)")

    async def _check_recorded_bytes(self, tenant: Tenant, payloads: Sequence[JobPayload]) -> None:
        """Refuse session cells whose records would take a session or the tenant past its bound
        of recorded bytes (one round trip, only for requests with session cells)."""
        adding: dict[str, int] = {}
        for p in payloads:
            if p.session_id is not None and not (p.end_session or p.fork_to):
                size = estimated_record_bytes(p.code, p.stdin, p.files)
                adding[p.session_id] = adding.get(p.session_id, 0) + size
        if not adding:
            return
        session_ids = sorted(adding)
        try:
            usage = await recorded_usage(
                self.redis, self.settings.queue_name, tenant.name, session_ids
            )
        except (RedisError, OSError) as exc:
            raise Unavailable(f"redis unavailable: {exc}") from exc
        session_bound = self.settings.max_session_recorded_bytes
        for session_id, held in zip(session_ids, usage.session_bytes, strict=True):
            if held + adding[session_id] > session_bound:
                client_id = unscoped(tenant, session_id) or session_id
                raise OverRecorded(
                    f"session {client_id!r} would record {held + adding[session_id]} bytes of "
                    f"cells (code, stdin, files), past the server's max_session_recorded_bytes "
                    f"({session_bound}); start a new session",
                    per_session=True,
                )
        tenant_bound = self.settings.max_tenant_recorded_bytes
        total = usage.tenant_bytes + sum(adding.values())
        if total > tenant_bound:
            raise OverRecorded(
                f"tenant {tenant.name!r} would keep {total} bytes of recorded session cells, past "
                f"the server's max_tenant_recorded_bytes ({tenant_bound}); end sessions "
                "(DELETE /sessions/{id}) or retry when they expire",
                per_session=False,
            )

    async def _claim_sessions(
        self, tenant: Tenant, payloads: Sequence[JobPayload], now: float
    ) -> list[str]:
        """Count the request's sessions against the tenant's quota (429 past it); the new ones."""
        quota, share = tenant.max_sessions, await self._session_share(tenant)
        if share is not None and (quota is None or share < quota):
            quota = share
        if quota is None:
            return []
        # A fork's parent is not used by it; its copies are new sessions.
        session_ids = {
            p.session_id for p in payloads if p.session_id and not p.end_session and not p.fork_to
        } | {fork for p in payloads for fork in p.fork_to}
        if not session_ids:
            return []
        lifetime_s = self.settings.session_ttl_s + self.settings.api_wait_s(
            self.settings.max_timeout
        )
        key = keys.tenant_sessions(self.settings.queue_name, tenant.name)
        try:
            new = await quotas.claim_sessions(
                self.redis, key, sorted(session_ids), now, lifetime_s, quota
            )
        except (RedisError, OSError) as exc:
            raise Unavailable(f"redis unavailable: {exc}") from exc
        if new is None and quota == tenant.max_sessions:
            raise Overloaded(
                f"tenant {tenant.name!r} has its quota of sessions ({tenant.max_sessions})",
                "session_quota",
            )
        if new is None:
            raise Overloaded(
                f"tenant {tenant.name!r} holds its share of the live-session slots ({quota}: its "
                "weight's part of max_sessions_per_worker on every live worker); end sessions "
                "(DELETE /sessions/{id}) or retry when they expire",
                "session_share",
            )
        return new

    async def _session_share(self, tenant: Tenant) -> int | None:
        """The live sessions the tenant's weight entitles it to, when tenants share the cluster:
        its fraction of every live worker's session slots (at least one)."""
        fraction = self._session_fraction.get(tenant.name)
        if fraction is None:
            return None
        slots = await self._recent_live_workers() * self.settings.max_sessions_per_worker
        return max(1, int(slots * fraction))

    async def _unclaim_sessions(self, tenant: Tenant, session_ids: list[str]) -> None:
        """Stop counting these sessions (ended, or new in a request that was not admitted)."""
        if session_ids:
            key = keys.tenant_sessions(self.settings.queue_name, tenant.name)
            with contextlib.suppress(RedisError, OSError):
                await quotas.forget_sessions(self.redis, key, session_ids)

    async def _workers_for_chunks(self, calls: int) -> int:
        """Live workers, to size a request's chunks (0: no chunks; a recent count is reused)."""
        if calls <= 1:
            return 0
        return await self._recent_live_workers()

    async def _recent_live_workers(self) -> int:
        """Live workers, a count at most WORKERS_FRESH_S old (0 when Redis cannot say)."""
        now = time.monotonic()
        if now - self._workers_seen_at > WORKERS_FRESH_S:
            self._workers_seen_at = now
            try:
                self._workers_seen = await self.live_workers()
            except (RedisError, OSError):
                self._workers_seen = 0
        return self._workers_seen

    def abandon(self, futures: Sequence[asyncio.Future[ResultDict]]) -> None:
        """Nobody waits for these any more (the client went away): drop the jobs not started,
        kill the running ones (in the background: the request is over)."""
        execution_ids = self.awaiter.abandon(futures)
        if not execution_ids:
            return
        task = asyncio.create_task(self._cancel(execution_ids), name="cancel")
        self._cancelling.add(task)
        task.add_done_callback(self._cancelling.discard)

    def _abandon_if_admitted(
        self,
        admission: asyncio.Future[int],
        futures: Sequence[asyncio.Future[ResultDict]],
        bounds: GroupBounds,
        execution_ids: list[str],
    ) -> None:
        admitted = (
            not admission.cancelled()
            and admission.exception() is None
            and admission.result() == jobqueue.ADMITTED
        )
        if admitted:
            self.abandon(futures)
            self._in_flight.release(bounds.in_flight_key, execution_ids)
        else:
            self.awaiter.abandon(futures)

    async def _cancel(self, execution_ids: list[str]) -> None:
        try:
            dropped, signalled = await self._run_sync(
                self._job_queue.cancel, execution_ids, self._marker_ttl_s()
            )
        except (RedisError, OSError) as exc:
            log.warning("cancelling abandoned jobs failed: %s", exc)
            return
        self.cancelled_dropped += len(dropped)
        self.cancelled_killed += len(signalled)
        log.info(
            "abandoned jobs cancelled",
            extra=fields(jobs=len(execution_ids), dropped=len(dropped), killed=len(signalled)),
        )

    async def cancel_group(self, group_id: str, request_id: str = "") -> GroupCancel | None:
        """Cancel every waiting and running call of a group (its internal id) and end its
        sessions; None when the group was never used (or expired)."""
        dropped: list[str] = []
        signalled: list[str] = []
        try:
            used, execution_ids, session_ids = await self._run_sync(
                self._job_queue.group_members, group_id
            )
            if not used:
                return None
            if execution_ids:
                dropped, signalled = await self._run_sync(
                    self._job_queue.cancel,
                    execution_ids,
                    self._marker_ttl_s(),
                    GROUP_CANCELLED,
                    True,
                )
                await self._run_sync(self._job_queue.leave_group, group_id, [*dropped, *signalled])
        except (RedisError, OSError) as exc:
            raise Unavailable(f"redis unavailable: {exc}") from exc
        # The sessions' cells of this group were cancelled above, so their ends run at once.
        ended = await asyncio.gather(
            *(self.end_session(session_id, request_id) for session_id in session_ids)
        )
        await self._run_sync(self._job_queue.forget_group_sessions, group_id, session_ids)
        for session_id, was_ended in zip(session_ids, ended, strict=True):
            if was_ended:
                await self.session_ended(session_id)
        log.info(
            "group cancelled",
            extra=fields(
                group=group_id,
                dropped=len(dropped),
                killed=len(signalled),
                sessions=sum(ended),
            ),
        )
        return GroupCancel(len(dropped) + len(signalled), sum(ended))

    def _marker_ttl_s(self) -> int:
        return int(self.settings.api_wait_s(self.settings.max_timeout)) + 1

    async def end_session(self, session_id: str, request_id: str = "") -> bool:
        """End a session (DELETE /sessions/{id}); whether it existed.

        The ending runs on the session's owner, behind the cells already queued there (they run
        first), and frees the interpreter there; with no live owner any worker forgets the keys.
        """
        payload = JobPayload(
            code="", session_id=session_id, end_session=True, timeout_s=1.0, request_id=request_id
        )
        (result,) = await self.submit([payload])
        if "ended" in result:
            return bool(result["ended"])
        # Not run (queue deadline, lost worker): forget its keys here; a stale interpreter is
        # dropped by its worker at the session's next cell or when it idles out.
        ended: bool = await self._run_sync(self.sessions.forget, session_id)
        return ended

    async def fork_session(
        self, session_id: str, forks: Sequence[str], request_id: str = ""
    ) -> bool | None:
        """Fork a session (its internal id) into new sessions named `forks` (internal ids, of
        the same tenant); whether it existed (None: the fork job did not run: the queue
        deadline passed or its worker was lost).

        Like an ending, the fork runs on the session's owner behind the cells already queued
        there, so the forks copy the state those cells leave."""
        payload = JobPayload(
            code="",
            session_id=session_id,
            fork_to=tuple(forks),
            timeout_s=1.0,
            request_id=request_id,
        )
        (result,) = await self.submit([payload])  # the forks count in the tenant's quota
        if result["status"] == "ok":
            return True
        await self.sessions_ended(forks)
        if result["status"] == "error" and result["stderr"] == NO_SESSION:
            return False
        return None

    async def session_ended(self, session_id: str) -> None:
        """Stop counting an ended session against its tenant's quota."""
        await self.sessions_ended([session_id])

    async def sessions_ended(self, session_ids: Sequence[str]) -> None:
        """Stop counting these sessions (ended, or forks never made) against the quota."""
        tenant = tenant_var.get()
        if tenant.max_sessions is not None or tenant.name in self._session_fraction:
            await self._unclaim_sessions(tenant, list(session_ids))

    def route(self, jobs: Sequence[NewJob]) -> list[NewJob]:
        """The jobs with their queues set: session work to its owner's own queue (blocking)."""
        sessions = [
            (job.payload.session_id, not (job.payload.end_session or job.payload.fork_to))
            for job in jobs
            if job.payload.session_id is not None
        ]
        if not sessions:
            return list(jobs)
        queues = iter(self.sessions.route(sessions))
        routed: list[NewJob] = []
        for job in jobs:
            queue = next(queues) if job.payload.session_id is not None else None
            # The store answers the shared queue when no worker owns the session: the job
            # then stays on its tenant's shared queue.
            if queue is None or queue == self.settings.queue_name:
                routed.append(job)
            else:
                routed.append(replace(job, queue=queue))
        return routed

    def _route_groups(self, groups: Sequence[Sequence[NewJob]]) -> Sequence[Sequence[NewJob]]:
        if not any(job.payload.session_id is not None for group in groups for job in group):
            return groups
        flat = iter(self.route([job for group in groups for job in group]))
        return [[next(flat) for _ in group] for group in groups]

    def _admission(
        self, groups: Sequence[Sequence[NewJob]], bounds: Sequence[GroupBounds]
    ) -> tuple[list[str], list[Any]]:
        """Route session work (a blocking round trip, only when there is some), then build the
        admission script's KEYS and ARGV."""
        routed = self._route_groups(groups)
        return self._job_queue.admission(
            routed, self.settings.max_queue_depth, bounds, self._tenant_queues
        )

    async def _admit_round(
        self, groups: Sequence[Sequence[NewJob]], bounds: Sequence[GroupBounds], size: int
    ) -> list[int]:
        has_sessions = any(job.payload.session_id is not None for group in groups for job in group)
        if size <= BUILD_ON_LOOP_MAX_JOBS and not has_sessions:
            script_keys, argv = self._admission(groups, bounds)
        else:
            script_keys, argv = await self._run_sync(self._admission, groups, bounds)
        replies = await self._admission_connection.run_script(
            jobqueue.ADMIT_SCRIPT, script_keys, argv
        )
        return [int(verdict) for verdict in replies]

    @property
    def awaiter_reply_key(self) -> str:
        """The list this process's completion notices arrive on."""
        return keys.reply(self.settings.queue_name, self.api_id)

    def _request_admission(self, jobs: list[NewJob], bounds: GroupBounds) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._to_admit.put_nowait((jobs, bounds, future))
        return future

    async def _admit_loop(self) -> None:
        while True:
            first = await self._to_admit.get()
            batch = [first]
            size = len(first[0])
            while size < ADMISSION_ROUND_MAX_JOBS and not self._to_admit.empty():
                item = self._to_admit.get_nowait()
                batch.append(item)
                size += len(item[0])
            groups = [jobs for jobs, _, _ in batch]
            bounds = [bound for _, bound, _ in batch]
            try:
                verdicts = await self._admit_round(groups, bounds, size)
            except (RedisError, OSError) as exc:
                error = Unavailable(f"redis unavailable: {exc}")
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, _, future), verdict in zip(batch, verdicts, strict=True):
                if not future.done():
                    future.set_result(verdict)

    async def readiness(self) -> tuple[bool, str]:
        """(ready, reason): Redis reachable and at least one worker alive."""
        if self.draining:
            return False, "the server is shutting down"
        try:
            workers = await asyncio.wait_for(self.live_workers(), timeout=2.0)
        except (RedisError, OSError, TimeoutError) as exc:
            return False, f"redis unreachable: {exc or type(exc).__name__}"
        if workers == 0:
            return False, "no live worker"
        return True, f"{workers} live workers"

    async def live_workers(self) -> int:
        """Workers whose heartbeat is fresh."""
        return await Liveness.of(self.settings).count_live(self.redis)

    async def worker_stats(self) -> dict[str, WorkerStats]:
        """The own counters of the workers alive now, by worker name."""
        return await worker_stats.read_live(self.redis, Liveness.of(self.settings))

    async def recorded_bytes(self) -> dict[str, int]:
        """Bytes of recorded session cells each configured tenant keeps in Redis (what expired
        pruned first)."""
        queue = self.settings.queue_name
        usages = await asyncio.gather(
            *(recorded_usage(self.redis, queue, t.name, ()) for t in self.settings.tenants())
        )
        return {
            t.name: usage.tenant_bytes
            for t, usage in zip(self.settings.tenants(), usages, strict=True)
        }

    async def queue_depth(self) -> int:
        """Calls waiting: in the shared queues and in the workers' own queues (session cells)."""
        queue = self.settings.queue_name
        depth = await self._depth_script(
            keys=[
                keys.rq_queue(queue),
                Liveness.of(self.settings).key,
                *(keys.rq_queue(q) for q in self._tenant_queues),
            ]
        )
        return int(depth)


def _stamped(
    payloads: Sequence[JobPayload],
    plan: Sequence[Sequence[int]],
    reply_to: str,
    admitted_at: float,
    settings: Settings,
) -> list[JobPayload]:
    """The request's calls as admitted: this API's reply list, their admission time and their
    start-by time (the queue deadline, or the call's own deadline if sooner). A chunk waits
    and is withdrawn as one: its calls share the latest start-by time of its calls."""
    queue_start_by = admitted_at + settings.queue_deadline_s
    start_by = [
        min(queue_start_by, payload.deadline) if payload.deadline else queue_start_by
        for payload in payloads
    ]
    for indices in plan:
        if len(indices) > 1:
            shared = max(start_by[i] for i in indices)
            for i in indices:
                start_by[i] = shared
    return [
        replace(payload, reply_to=reply_to, admitted_at=admitted_at, start_by=start_by[i])
        for i, payload in enumerate(payloads)
    ]
