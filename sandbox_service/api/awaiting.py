"""How one API process awaits thousands of results without a Redis connection per request.

Each outstanding job is an asyncio future in `Outstanding`. Two tasks resolve them:

- the listener pops completion notices from this process's reply list (one connection it holds,
  BLMPOP, up to 512 notices per round trip) and resolves futures from the inline result;
- the watchdog re-checks jobs that have waited a while (after poll_interval_s, then with doubling
  intervals): a stored result whose notice was lost is delivered; a job still queued past its
  start-by time is withdrawn and answered queue_timeout; a started job whose worker stopped beating
  (or a job Redis lost) is run again once, then answered sandbox_error; a job queued on the own
  queue of a worker that died (a session cell) is routed again, to the session's new owner; a job
  past its wait deadline is answered sandbox_error. So no request hangs, whatever dies.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from sandbox_service import keys
from sandbox_service.api.watchdog_rules import Action, decide, next_check_every
from sandbox_service.broker.held_connection import HeldConnection
from sandbox_service.broker.jobqueue import JobQueue, JobState, NewJob
from sandbox_service.broker.liveness import Liveness
from sandbox_service.execution import Status
from sandbox_service.jobs import JobPayload, ResultDict, decode_notice, failure_result
from sandbox_service.logs import fields
from sandbox_service.settings import Settings

log = logging.getLogger(__name__)

RunSync = Callable[..., Awaitable[Any]]
"""Runs a blocking JobQueue call in a thread: `await run_sync(fn, *args)`."""

Route = Callable[[Sequence[NewJob]], list[NewJob]]
"""Sets each job's queue (session work: its owner's own queue); blocking, run via RunSync."""


@dataclass(slots=True)
class Pending:
    """One job this process waits for."""

    payload: JobPayload
    future: asyncio.Future[ResultDict]
    give_up_at: float
    """Monotonic deadline of the wait (settings.api_wait_s after admission)."""
    next_check: float
    check_every: float
    admitted: bool = False
    queue: str = ""
    """The RQ queue a stateless job goes to (its tenant's shared queue; empty: the shared one);
    a retry goes there too."""


class Outstanding:
    """The futures of this process's jobs, by job id."""

    def __init__(self) -> None:
        self.jobs: dict[str, Pending] = {}

    def add(self, execution_id: str, pending: Pending) -> None:
        """Start waiting for execution_id."""
        self.jobs[execution_id] = pending

    def resolve(self, execution_id: str, result: ResultDict) -> None:
        """Hand a result to the waiting request, if any still waits."""
        pending = self.jobs.pop(execution_id, None)
        if pending is not None and not pending.future.done():
            pending.future.set_result(result)

    def discard(self, execution_ids: Sequence[str]) -> None:
        """Stop waiting (the jobs were never admitted)."""
        for execution_id in execution_ids:
            self.jobs.pop(execution_id, None)


class Awaiter:
    """The listener and watchdog tasks of one API process."""

    def __init__(
        self,
        settings: Settings,
        reply_key: str,
        job_queue: JobQueue,
        run_sync: RunSync,
        listen_redis: aioredis.Redis,
        redis: aioredis.Redis,
        route: Route = list,
        on_retry: Callable[[], None] = lambda: None,
    ) -> None:
        self.outstanding = Outstanding()
        self._settings = settings
        self._reply_key = reply_key
        self._job_queue = job_queue
        self._run_sync = run_sync
        self._listen = HeldConnection(listen_redis)
        self._redis = redis
        self._route = route
        self._on_retry = on_retry
        self._max_check_every = 4 * settings.poll_interval_s

    def track(
        self, execution_id: str, payload: JobPayload, queue: str = ""
    ) -> asyncio.Future[ResultDict]:
        """Register a job before it is enqueued (its notice may beat the enqueue's reply)."""
        now = time.monotonic()
        future: asyncio.Future[ResultDict] = asyncio.get_running_loop().create_future()
        self.outstanding.add(
            execution_id,
            Pending(
                payload=payload,
                future=future,
                give_up_at=now + self._wait_s(payload),
                next_check=now + self._settings.poll_interval_s,
                check_every=self._settings.poll_interval_s,
                queue=queue,
            ),
        )
        return future

    def _wait_s(self, payload: JobPayload) -> float:
        return payload.api_wait_s(self._settings)

    def abandon(self, futures: Sequence[asyncio.Future[ResultDict]]) -> list[str]:
        """Stop waiting for these futures' jobs; their current ids (a retried job has a new one)."""
        wanted = {id(future) for future in futures}
        execution_ids = [
            execution_id
            for execution_id, pending in self.outstanding.jobs.items()
            if id(pending.future) in wanted
        ]
        self.outstanding.discard(execution_ids)
        return execution_ids

    def mark_admitted(self, execution_ids: Sequence[str]) -> None:
        """The jobs are in the queue: the watchdog may inspect them now."""
        for execution_id in execution_ids:
            pending = self.outstanding.jobs.get(execution_id)
            if pending is not None:
                pending.admitted = True

    async def listen(self) -> None:
        """Resolve futures from completion notices, until cancelled."""
        backoff_s = 0.05
        while True:
            try:
                popped = await self._listen.execute(
                    "BLMPOP", 1, 1, self._reply_key, "LEFT", "COUNT", 512
                )
                backoff_s = 0.05
                if popped:
                    notices: list[bytes] = popped[1]
                    await self._on_notices(notices)
            except (RedisError, OSError) as exc:
                log.warning("reply listener: redis error: %s", exc)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)

    async def release(self) -> None:
        """Give the listener's connection back (the listener has stopped)."""
        await self._listen.release()

    async def _on_notices(self, notices: Sequence[bytes]) -> None:
        to_fetch: list[str] = []
        for raw in notices:
            execution_id, result = decode_notice(raw)
            if result is None:
                to_fetch.append(execution_id)
            else:
                self.outstanding.resolve(execution_id, result)
        if to_fetch:
            queue = self._settings.queue_name
            values = await self._redis.mget([keys.result(queue, j) for j in to_fetch])
            for execution_id, value in zip(to_fetch, values, strict=True):
                if value is not None:  # else the watchdog finds out what happened
                    self.outstanding.resolve(execution_id, json.loads(value))

    async def watch(self) -> None:
        """Re-check waiting jobs every poll_interval_s, until cancelled."""
        while True:
            await asyncio.sleep(self._settings.poll_interval_s)
            try:
                await self.check_once()
            except (RedisError, OSError) as exc:
                log.warning("watchdog: redis error: %s", exc)
            except Exception:
                log.exception("watchdog round failed")

    async def check_once(self) -> None:
        """One watchdog round (see module doc)."""
        now = time.monotonic()
        expired: list[str] = []
        due: list[str] = []
        for execution_id, pending in self.outstanding.jobs.items():
            if not pending.admitted:
                continue
            if now >= pending.give_up_at:
                expired.append(execution_id)
            elif now >= pending.next_check:
                due.append(execution_id)
        for execution_id in expired:
            self._answer(
                execution_id, Status.SANDBOX_ERROR, "no result within the server's deadline"
            )
        if expired:
            await self._run_sync(self._job_queue.withdraw, expired)
        if not due:
            return
        due = due[:5000]
        alive_since = Liveness.of(self._settings).alive_since()
        states: list[JobState] = await self._run_sync(self._job_queue.inspect, due, alive_since)
        # Cells of a session stranded on a dead worker's queue may wait behind one that was
        # running there: look at the session's other jobs now, so that the running one is run
        # again (at the front of the new owner's queue) in the same round, before them.
        stranded = {
            self.outstanding.jobs[execution_id].payload.session_id
            for execution_id, state in zip(due, states, strict=True)
            if state.kind == "stranded" and execution_id in self.outstanding.jobs
        }
        if stranded:
            seen = set(due)
            more = [
                execution_id
                for execution_id, pending in self.outstanding.jobs.items()
                if pending.admitted
                and execution_id not in seen
                and pending.payload.session_id in stranded
            ]
            if more:
                due += more
                states += await self._run_sync(self._job_queue.inspect, more, alive_since)
        await self._act(due, states)

    async def _act(self, execution_ids: Sequence[str], states: Sequence[JobState]) -> None:
        now_m, now = time.monotonic(), time.time()
        withdraw: list[str] = []
        withdraw_from: list[str] = []
        retry: list[str] = []
        fail: list[str] = []
        stranded: list[JobState] = []
        stranded_ids: list[str] = []
        for execution_id, state in zip(execution_ids, states, strict=True):
            pending = self.outstanding.jobs.get(execution_id)
            if pending is None:
                continue  # resolved by the listener meanwhile
            action = decide(
                state.kind,
                state.result is not None,
                now,
                pending.payload.start_by,
                pending.payload.attempt,
                self._settings.lost_job_retries,
            )
            if action is Action.DELIVER:
                assert state.result is not None
                self.outstanding.resolve(execution_id, state.result)
                continue
            if action is Action.WITHDRAW:
                withdraw.append(execution_id)
                withdraw_from.append(state.queue)
            elif action is Action.RETRY:
                retry.append(execution_id)
            elif action is Action.FAIL:
                fail.append(execution_id)
            elif action is Action.REROUTE:
                stranded_ids.append(execution_id)
                stranded.append(state)
            pending.check_every = next_check_every(pending.check_every, self._max_check_every)
            pending.next_check = now_m + pending.check_every
        if withdraw:
            removed = await self._run_sync(self._job_queue.withdraw, withdraw, withdraw_from)
            for execution_id, was_removed in zip(withdraw, removed, strict=True):
                pending = self.outstanding.jobs.get(execution_id)
                if not was_removed or pending is None:
                    continue
                if pending.payload.past_deadline(now):
                    self._answer(
                        execution_id,
                        Status.DEADLINE_EXCEEDED,
                        "the request's deadline passed before it started; it never ran",
                    )
                else:
                    self._answer(
                        execution_id, Status.QUEUE_TIMEOUT, "not started within the queue deadline"
                    )
        if fail:
            await self._run_sync(self._job_queue.forget, fail)
            for execution_id in fail:
                self._answer(
                    execution_id, Status.SANDBOX_ERROR, "the worker running this job was lost"
                )
        if retry:
            await self._retry(retry, now)
        if stranded_ids:
            await self._reroute(stranded_ids, [state.queue for state in stranded])

    async def _reroute(self, execution_ids: Sequence[str], queues: Sequence[str]) -> None:
        """Move jobs (never started) off the own queues of dead workers, in their order."""
        await self._run_sync(self._job_queue.withdraw, execution_ids, queues)
        # One that was not in its queue any more was popped by its worker as it died (the reply
        # of a pending BLPOP goes to a socket the kernel has not closed yet): move it as well.
        # Only the owner reads its own queue, so a worker that merely beat late may run it too;
        # the first result wins, as for lost jobs.
        await self._run_sync(self._job_queue.forget, execution_ids)
        moved: list[NewJob] = []
        for execution_id in execution_ids:
            pending = self.outstanding.jobs.get(execution_id)
            if pending is None:
                continue
            job = NewJob.of(execution_id, pending.payload, self._settings)
            moved.append(replace(job, queue=pending.queue))
            log.warning(
                "job queued on a dead worker; routing it again",
                extra=fields(execution_id=execution_id, request_id=pending.payload.request_id),
            )
        if moved:
            await self._run_sync(self._job_queue.enqueue, await self._run_sync(self._route, moved))

    async def _retry(self, execution_ids: Sequence[str], now: float) -> None:
        await self._run_sync(self._job_queue.forget, execution_ids)
        retries: list[tuple[str, str, Pending]] = []
        for execution_id in execution_ids:
            pending = self.outstanding.jobs.get(execution_id)
            if pending is not None:
                retries.append((execution_id, uuid.uuid4().hex, pending))
        if not retries:
            return
        new_jobs: list[NewJob] = []
        for old_id, new_id, pending in retries:
            payload = pending.payload.retried(now, self._settings.queue_deadline_s)
            self.outstanding.jobs.pop(old_id, None)
            self.outstanding.add(
                new_id,
                replace(
                    pending,
                    payload=payload,
                    give_up_at=time.monotonic() + self._wait_s(payload),
                    check_every=self._settings.poll_interval_s,
                    next_check=time.monotonic() + self._settings.poll_interval_s,
                ),
            )
            job = NewJob.of(new_id, payload, self._settings)
            new_jobs.append(replace(job, queue=pending.queue))
            log.warning(
                "job lost with its worker; running it again",
                extra=fields(
                    execution_id=old_id, retry_job_id=new_id, request_id=payload.request_id
                ),
            )
            self._on_retry()
        routed = await self._run_sync(self._route, new_jobs)
        await self._run_sync(self._job_queue.enqueue, routed, True)

    def _answer(self, execution_id: str, status: Status, message: str) -> None:
        pending = self.outstanding.jobs.get(execution_id)
        if pending is None:
            return
        queue_time = time.time() - pending.payload.admitted_at
        log.warning(
            message, extra=fields(execution_id=execution_id, request_id=pending.payload.request_id)
        )
        self.outstanding.resolve(
            execution_id, failure_result(status, message, execution_id, queue_time)
        )

    def fail_all(self, message: str) -> None:
        """Answer every waiting request sandbox_error (the process is stopping)."""
        for execution_id in list(self.outstanding.jobs):
            self._answer(execution_id, Status.SANDBOX_ERROR, message)
