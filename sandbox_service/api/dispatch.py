"""The API's execution core: admit a group of jobs whole or not at all, then await their results.

Errors of the service itself (a program's failure is a result, never one of these):

    DispatchError
    ├── Overloaded   the queue is at its bound: 429 with Retry-After; nothing was enqueued
    └── Unavailable  Redis unreachable, or the process is shutting down: 503 with the reason

Admission is batched: one task collects every group waiting to be admitted and sends them all in
one Lua script (jobqueue.ADMIT_SCRIPT) that checks the queue depth and enqueues each group that
fits: one round trip for any number of requests, from the event loop (no thread hop on the hot
path) on a connection the admission task holds (held_connection.py), and the bound is exact
across replicas. The enqueue commands are built on the loop for a small round and in a thread for
a large one (a 1,024-request batch costs about 12 milliseconds).

A round with session cells first routes them (one more round trip): each goes to the own queue of
its session's owner, claimed in Redis (session_store.py). The bound counts the shared queue and
the workers' own queues together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from redis.exceptions import RedisError

from sandbox_service import keys
from sandbox_service.api.awaiting import Awaiter
from sandbox_service.broker import jobqueue, worker_stats
from sandbox_service.broker.held_connection import HeldConnection
from sandbox_service.broker.jobqueue import JobQueue, NewJob
from sandbox_service.broker.liveness import Liveness
from sandbox_service.broker.session_store import SessionStore
from sandbox_service.broker.worker_stats import WorkerStats
from sandbox_service.jobs import NO_SESSION, JobPayload, ResultDict
from sandbox_service.logs import fields
from sandbox_service.settings import Settings
from sandbox_service.tenancy import scoped, tenant_var

log = logging.getLogger(__name__)

ADMISSION_ROUND_MAX_JOBS = 8192
"""Most jobs one admission round enqueues (one script call)."""
BUILD_ON_LOOP_MAX_JOBS = 64
"""Rounds up to this many jobs build their enqueue commands on the event loop (11 to 16 us per job
here, so under 1 ms of the loop; a thread hop costs about 0.1 ms of CPU); larger ones in a
thread, so that the loop keeps serving meanwhile."""


def session_key(client_id: str) -> str:
    """The internal id of the calling tenant's session `client_id` (Redis keys, worker pools):
    another tenant's same id is another session, and no tenant can name another's."""
    return scoped(tenant_var.get(), client_id)


class DispatchError(Exception):
    """The service could not take the request (see the module doc for the hierarchy)."""


class Overloaded(DispatchError):
    """The queue is full."""


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
        self._job_queue = JobQueue(connection, settings.queue_name, settings.result_ttl_s)
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
        self._to_admit: asyncio.Queue[tuple[list[NewJob], asyncio.Future[bool]]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    def _count_retry(self) -> None:
        self.retries += 1

    async def _run_sync(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def start(self) -> None:
        """Start the admission, listener and watchdog tasks."""
        self._tasks = [
            asyncio.create_task(self._admit_loop(), name="admission"),
            asyncio.create_task(self.awaiter.listen(), name="reply-listener"),
            asyncio.create_task(self.awaiter.watch(), name="watchdog"),
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
        admitted_at = time.time()
        start_by = admitted_at + self.settings.queue_deadline_s
        jobs: list[NewJob] = []
        futures: list[asyncio.Future[ResultDict]] = []
        for payload in payloads:
            execution_id = uuid.uuid4().hex
            stamped = replace(
                payload,
                reply_to=self.awaiter_reply_key,
                admitted_at=admitted_at,
                start_by=start_by,
            )
            futures.append(self.awaiter.track(execution_id, stamped))
            jobs.append(NewJob.of(execution_id, stamped, self.settings))
        execution_ids = [job.execution_id for job in jobs]
        admission = self._request_admission(jobs)
        try:
            admitted = await asyncio.shield(admission)
        except asyncio.CancelledError:
            # The client went away during admission: cancel the jobs if they were admitted.
            admission.add_done_callback(lambda done: self._abandon_if_admitted(done, futures))
            raise
        except BaseException:
            self.awaiter.outstanding.discard(execution_ids)
            raise
        if not admitted:
            self.awaiter.outstanding.discard(execution_ids)
            raise Overloaded(f"the queue is full ({self.settings.max_queue_depth} jobs)")
        self.awaiter.mark_admitted(execution_ids)
        try:
            return list(await asyncio.gather(*futures))
        except asyncio.CancelledError:
            self.abandon(futures)
            raise

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
        self, admission: asyncio.Future[bool], futures: Sequence[asyncio.Future[ResultDict]]
    ) -> None:
        if not admission.cancelled() and admission.exception() is None and admission.result():
            self.abandon(futures)
        else:
            self.awaiter.abandon(futures)

    async def _cancel(self, execution_ids: list[str]) -> None:
        marker_ttl_s = int(self.settings.api_wait_s(self.settings.max_timeout)) + 1
        try:
            dropped, signalled = await self._run_sync(
                self._job_queue.cancel, execution_ids, marker_ttl_s
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

    async def end_session(self, client_id: str, request_id: str = "") -> bool:
        """End a session (DELETE /sessions/{id}); whether it existed.

        The ending runs on the session's owner, behind the cells already queued there (they run
        first), and frees the interpreter there; with no live owner any worker forgets the keys.
        """
        session_id = session_key(client_id)
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
        self, client_id: str, forks: Sequence[str], request_id: str = ""
    ) -> bool | None:
        """Fork a session into new sessions named `forks` (all the caller's ids, of the
        caller's tenant); whether it existed (None: the fork job did not run: the queue
        deadline passed or its worker was lost).

        Like an ending, the fork runs on the session's owner behind the cells already queued
        there, so the forks copy the state those cells leave."""
        payload = JobPayload(
            code="",
            session_id=session_key(client_id),
            fork_to=tuple(session_key(fork) for fork in forks),
            timeout_s=1.0,
            request_id=request_id,
        )
        (result,) = await self.submit([payload])
        if result["status"] == "ok":
            return True
        if result["status"] == "error" and result["stderr"] == NO_SESSION:
            return False
        return None

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
        return [
            replace(job, queue=next(queues)) if job.payload.session_id is not None else job
            for job in jobs
        ]

    def _route_groups(self, groups: Sequence[Sequence[NewJob]]) -> Sequence[Sequence[NewJob]]:
        if not any(job.payload.session_id is not None for group in groups for job in group):
            return groups
        flat = iter(self.route([job for group in groups for job in group]))
        return [[next(flat) for _ in group] for group in groups]

    def _admission(self, groups: Sequence[Sequence[NewJob]]) -> tuple[list[str], list[Any]]:
        """Route session work (a blocking round trip, only when there is some), then build the
        admission script's KEYS and ARGV."""
        routed = self._route_groups(groups)
        return self._job_queue.admission(routed, self.settings.max_queue_depth)

    async def _admit_round(self, groups: Sequence[Sequence[NewJob]], size: int) -> list[bool]:
        has_sessions = any(job.payload.session_id is not None for group in groups for job in group)
        if size <= BUILD_ON_LOOP_MAX_JOBS and not has_sessions:
            script_keys, argv = self._admission(groups)
        else:
            script_keys, argv = await self._run_sync(self._admission, groups)
        replies = await self._admission_connection.run_script(
            jobqueue.ADMIT_SCRIPT, script_keys, argv
        )
        return [bool(flag) for flag in replies]

    @property
    def awaiter_reply_key(self) -> str:
        """The list this process's completion notices arrive on."""
        return keys.reply(self.settings.queue_name, self.api_id)

    def _request_admission(self, jobs: list[NewJob]) -> asyncio.Future[bool]:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._to_admit.put_nowait((jobs, future))
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
            groups = [jobs for jobs, _ in batch]
            try:
                flags = await self._admit_round(groups, size)
            except (RedisError, OSError) as exc:
                error = Unavailable(f"redis unavailable: {exc}")
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), ok in zip(batch, flags, strict=True):
                if not future.done():
                    future.set_result(ok)

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

    async def queue_depth(self) -> int:
        """Jobs waiting: in the shared queue and in the workers' own queues (session cells)."""
        queue = self.settings.queue_name
        depth = await self._depth_script(
            keys=[keys.rq_queue(queue), Liveness.of(self.settings).key]
        )
        return int(depth)
