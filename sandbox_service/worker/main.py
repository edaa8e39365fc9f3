"""One worker process: owns one executor slot and runs jobs from the queue, one at a time.

`rl-sandbox worker` starts settings.workers of these (see supervisor.py). Each one reports itself
alive in Redis every worker_heartbeat_s from a thread, so the API can tell a lost worker (its job
is re-run or answered sandbox_error) from a slow one. Session cells arrive on the worker's own
queue and run in the session's interpreter (worker_sessions.py), not in the executor.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import redis

from sandbox_service import keys
from sandbox_service.broker import jobqueue, worker_stats
from sandbox_service.broker.liveness import Liveness
from sandbox_service.broker.session_store import SessionStore
from sandbox_service.cancel import KILLED_NOTE, Cancel, never_ran
from sandbox_service.execution import ExecutionResult, Status
from sandbox_service.jobs import (
    NO_SESSION,
    JobPayload,
    ResultDict,
    failure_result,
    result_to_wire,
)
from sandbox_service.logs import configure_logging, fields, request_id_var
from sandbox_service.settings import Settings, UnknownSettingError
from sandbox_service.worker.tally import Tally

if TYPE_CHECKING:
    from sandbox_service.jail.zygotes import SlotExecutor
    from sandbox_service.worker.sessions import SessionRunner

log = logging.getLogger(__name__)


def execute(wire: dict[str, Any]) -> None:
    """The function RQ jobs name; LeanWorker hands the decoded payload to its JobRunner instead."""
    raise RuntimeError("rl-sandbox jobs run only in `rl-sandbox worker` processes")


def worker_name(slot: int, pid: int) -> str:
    """The RQ and heartbeat name of the worker process `pid` serving `slot` on this host."""
    return f"{socket.gethostname()}:{slot}:{pid}"


DEADLINE_NEVER_RAN = (
    "deadline_exceeded: the request's deadline passed before it started; it never ran"
)
STACK_DUMP_SIGNAL = signal.SIGUSR2
"""Makes a worker write every thread's stack to stderr (the supervisor sends it to a worker
still there at the end of its shutdown grace, before killing it)."""
DEADLINE_NOTE = "\ndeadline_exceeded: the request's deadline passed; the program was stopped"
STOPPED_FROM_OUTSIDE = frozenset({Status.TIMEOUT, Status.SANDBOX_ERROR, Status.KILLED})
"""What a cancelled program's own result says (killed by the abort, or its jail torn down)."""


def within_deadline(job: JobPayload, now: float) -> tuple[JobPayload, bool]:
    """The job with its program limit cut to what is left of its deadline, and whether it was
    cut (a timeout then means the deadline passed)."""
    if not job.deadline or job.deadline - now >= job.timeout_s:
        return job, False
    return replace(job, timeout_s=max(0.001, job.deadline - now)), True


class JobRunner:
    """Turns job payloads into results with one executor (the jobqueue.JobHandler of a worker)."""

    def __init__(
        self,
        settings: Settings,
        make_executor: Callable[[], SlotExecutor],
        sessions: SessionRunner | None = None,
        tally: Tally | None = None,
    ) -> None:
        self._limits = settings.limits()
        self._compile_timeout_s = settings.compile_timeout_s
        self._make_executor = make_executor
        self._executor: SlotExecutor | None = None
        self._sessions = sessions
        self.tally = tally or Tally()
        self._executor_lock = threading.Lock()
        """Held while the executor is swapped out, so that stats() never counts it twice."""
        # The cancel watcher's thread and the job's: which job runs, with its cancellation, and
        # the jobs cancelled in the moment between their dequeue and their start.
        self._lock = threading.Lock()
        self._current: tuple[str, Cancel] | None = None
        self._cancelled_early: collections.deque[str] = collections.deque(maxlen=256)

    def cancel(self, execution_id: str) -> bool:
        """Kill execution_id's program if it runs now (from any thread); whether it was running."""
        with self._lock:
            if self._current is None or self._current[0] != execution_id:
                self._cancelled_early.append(execution_id)
                return False
            cancel = self._current[1]
        cancel.request()
        return True

    def _start(self, execution_id: str) -> Cancel:
        cancel = Cancel()
        with self._lock:
            self._current = (execution_id, cancel)
            if execution_id in self._cancelled_early:
                cancel.request()
        return cancel

    def _finish(self) -> None:
        with self._lock:
            self._current = None

    def warm_up(self) -> None:
        """Start the executor now rather than on the first job."""
        if self._executor is None:
            self._executor = self._make_executor()

    def run(self, execution_id: str, job: JobPayload) -> ResultDict:
        """Run one job, or answer queue_timeout when it was dequeued past its start-by time."""
        token = request_id_var.set(job.request_id)
        cancel = self._start(execution_id)
        try:
            started = time.time()
            queue_time = max(0.0, started - job.admitted_at)
            restored = False
            if job.end_session:  # cheap and never harmful: run even past its start-by time
                ended = self._end_session(job, execution_id)
                self.tally.job_done(ended["status"])
                return ended
            if job.fork_to:  # as cheap: a copy of the session's records
                forked = self._fork_session(job, execution_id)
                self.tally.job_done(forked["status"])
                return forked
            run, cut = within_deadline(job, started)
            if job.past_deadline(started):
                result = ExecutionResult.failure(Status.DEADLINE_EXCEEDED, DEADLINE_NEVER_RAN)
            elif started > job.start_by:
                result = ExecutionResult.failure(
                    Status.QUEUE_TIMEOUT, "not started within the server's queue deadline"
                )
            elif cancel.requested:
                result = ExecutionResult.failure(Status.CANCELLED, never_ran(""))
            elif job.session_id is not None:
                result, restored = self._run_cell(run, execution_id, cancel)
            else:
                result = self._execute(run, execution_id, cancel)
            if cancel.requested and result.status in STOPPED_FROM_OUTSIDE:
                result = replace(
                    result, status=Status.CANCELLED, stderr=result.stderr + KILLED_NOTE
                )
            elif cut and result.status is Status.TIMEOUT:
                result = replace(
                    result, status=Status.DEADLINE_EXCEEDED, stderr=result.stderr + DEADLINE_NOTE
                )
            wire = result_to_wire(result, execution_id)
            wire.update(queue_time=queue_time, restored=restored)
            self.tally.job_done(wire["status"], result.cpu_time, restored)
            if not log.isEnabledFor(logging.INFO):
                return wire
            session = {} if job.session_id is None else {"session": job.session_id}
            log.info(
                "job done",
                extra=fields(
                    execution_id=execution_id,
                    status=wire["status"],
                    attempt=job.attempt,
                    queue_time=round(queue_time, 6),
                    wall_time=round(result.wall_time, 6),
                    total_time=round(time.time() - started, 6),
                    **session,
                    **({"restored": True} if restored else {}),
                ),
            )
            return wire
        finally:
            self._finish()
            request_id_var.reset(token)

    def _execute(self, job: JobPayload, execution_id: str, cancel: Cancel) -> ExecutionResult:
        try:
            spec = job.to_spec(execution_id, self._limits)
            self.warm_up()
            executor = self._executor
            assert executor is not None
            if job.language != "python":
                from sandbox_service.jail import compiled

                return compiled.run_program(
                    job.language,
                    spec,
                    lambda step: executor.run(step, cancel),
                    compiled.default_cache(),
                    job.tenant,
                    self._compile_timeout_s,
                )
            return executor.run(spec, cancel)
        except Exception as exc:  # the executor failed, not the program: reset the slot
            log.exception("executor failed", extra=fields(execution_id=execution_id))
            self.reset()
            return ExecutionResult.failure(Status.SANDBOX_ERROR, f"executor failed: {exc}")

    def _run_cell(
        self, job: JobPayload, execution_id: str, cancel: Cancel
    ) -> tuple[ExecutionResult, bool]:
        assert job.session_id is not None
        if self._sessions is None:
            return ExecutionResult.failure(Status.SANDBOX_ERROR, "no sessions here"), False
        try:
            spec = job.to_spec(execution_id, self._limits)
            return self._sessions.run_cell(job.session_id, spec, cancel)
        except Exception as exc:  # the session's jail failed, not the program
            log.exception("session cell failed", extra=fields(execution_id=execution_id))
            with contextlib.suppress(Exception):
                self._sessions.abandon(job.session_id)
            return ExecutionResult.failure(Status.SANDBOX_ERROR, f"session failed: {exc}"), False

    def _end_session(self, job: JobPayload, execution_id: str) -> ResultDict:
        assert job.session_id is not None
        if self._sessions is None:
            return failure_result(Status.SANDBOX_ERROR, "no sessions here", execution_id)
        ended = self._sessions.end(job.session_id)
        log.info(
            "session ended",
            extra=fields(execution_id=execution_id, session=job.session_id, ended=ended),
        )
        return result_to_wire(ExecutionResult(Status.OK, ended=ended), execution_id)

    def _fork_session(self, job: JobPayload, execution_id: str) -> ResultDict:
        """Fork the session: status ok when it existed, error when it did not."""
        assert job.session_id is not None
        if self._sessions is None:
            return failure_result(Status.SANDBOX_ERROR, "no sessions here", execution_id)
        try:
            forked = self._sessions.fork(job.session_id, job.fork_to)
        except redis.RedisError as exc:
            return failure_result(Status.SANDBOX_ERROR, f"session store: {exc}", execution_id)
        log.info(
            "session forked",
            extra=fields(execution_id=execution_id, session=job.session_id, forks=len(job.fork_to)),
        )
        if not forked:
            return result_to_wire(ExecutionResult(Status.ERROR, stderr=NO_SESSION), execution_id)
        return result_to_wire(ExecutionResult(Status.OK), execution_id)

    def abandon(self, execution_id: str, job: JobPayload, reason: str) -> ResultDict:
        """The run was interrupted: tear the jail down (a fresh one serves the next job)."""
        log.error("job abandoned: %s", reason, extra=fields(execution_id=execution_id))
        if job.session_id is not None and self._sessions is not None:
            self._sessions.abandon(job.session_id)
        else:
            self.reset()
        self.tally.job_done(Status.SANDBOX_ERROR)
        return failure_result(Status.SANDBOX_ERROR, reason, execution_id)

    def reset(self) -> None:
        """Close the executor; the next job starts a new one."""
        with self._executor_lock:
            executor, self._executor = self._executor, None
            if executor is not None:
                self.tally.retire(executor)
        if executor is not None:
            try:
                executor.close()
            except Exception:
                log.exception("closing the executor failed")

    def stats(self) -> worker_stats.WorkerStats:
        """This worker's counters now (from any thread)."""
        live = 0 if self._sessions is None else self._sessions.live_count
        with self._executor_lock:
            return self.tally.snapshot(self._executor, live)

    def close(self) -> None:
        """Close the executor and end every live session."""
        self.reset()
        if self._sessions is not None:
            try:
                self._sessions.close()
            except Exception:
                log.exception("closing the sessions failed")


class Heartbeat:
    """A thread that keeps this worker's score in the `alive` set fresh, and its stats with it."""

    def __init__(
        self,
        connection: redis.Redis,
        liveness: Liveness,
        name: str,
        interval_s: float,
        stats: Callable[[], worker_stats.WorkerStats] | None = None,
    ) -> None:
        self._redis = connection
        self._liveness = liveness
        self._name = name
        self._interval_s = interval_s
        self._stats = stats
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        """Beat once now, then every interval."""
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and leave the alive set."""
        self._stop.set()
        self._thread.join(timeout=5)
        self._liveness.leave(self._redis, self._name)
        worker_stats.forget(self._redis, self._liveness, self._name)

    def _run(self) -> None:
        while True:
            # Redis away: the API counts this worker dead meanwhile; beats resume with Redis.
            with contextlib.suppress(redis.RedisError):
                self._liveness.beat(self._redis, self._name)
            if self._stats is not None:
                try:
                    worker_stats.publish(self._redis, self._liveness, self._name, self._stats())
                except redis.RedisError:
                    pass
                except Exception:  # the stats are an aid: never let them stop the beats
                    log.exception("publishing the worker's stats failed")
            if self._stop.wait(self._interval_s):
                return


class CancelWatcher:
    """A thread that kills the running job when its client went away (the API says so).

    It blocks on this worker's cancel list, so a cancelled program is killed within a round
    trip, not at the next heartbeat.
    """

    BLOCK_S = 1.0

    def __init__(
        self, connection: redis.Redis, queue_name: str, name: str, runner: JobRunner
    ) -> None:
        self._redis = connection
        self._queue_name = queue_name
        self._name = name
        self._runner = runner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cancel-watcher", daemon=True)

    def start(self) -> None:
        """Start watching."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (within BLOCK_S)."""
        self._stop.set()
        self._thread.join(timeout=self.BLOCK_S + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                execution_id = jobqueue.next_cancelled(
                    self._redis, self._queue_name, self._name, self.BLOCK_S
                )
            except redis.RedisError:
                self._stop.wait(self.BLOCK_S)
                continue
            if execution_id is not None:
                killed = self._runner.cancel(execution_id)
                log.info("job cancelled", extra=fields(execution_id=execution_id, running=killed))


def run(settings: Settings, slot: int) -> int:
    """Serve jobs with executor slot `slot` until SIGTERM; returns the exit status."""
    from sandbox_service.jail.zygotes import slot_executor
    from sandbox_service.worker.sessions import SessionRunner

    if settings.redis_url is None:
        log.error("no Redis: set RL_SANDBOX_REDIS_URL (or REDIS_URL)")
        return 2
    name = worker_name(slot, os.getpid())
    beat_connection = jobqueue.connect(settings.redis_url)
    store = SessionStore.for_settings(beat_connection, settings)
    tally = Tally()
    sessions = SessionRunner(settings, slot, store, name, settings.session_spares, tally)
    runner = JobRunner(settings, lambda: slot_executor(settings, slot), sessions, tally)
    try:
        runner.warm_up()
    except Exception:
        log.exception("executor failed to start", extra=fields(slot=slot))
        return 3
    connection = jobqueue.connect_worker(settings.redis_url)
    heartbeat = Heartbeat(
        beat_connection, Liveness.of(settings), name, settings.worker_heartbeat_s, runner.stats
    )
    heartbeat.start()
    watcher = CancelWatcher(
        jobqueue.connect(settings.redis_url, socket_timeout_s=CancelWatcher.BLOCK_S + 5),
        settings.queue_name,
        name,
        runner,
    )
    watcher.start()
    sessions.start()
    own_queue = keys.worker_queue(settings.queue_name, name)
    log.info("worker ready", extra=fields(worker=name, slot=slot, mode=settings.executor_mode))
    try:
        jobqueue.work(
            connection,
            settings.queue_name,
            name,
            runner,
            settings.result_ttl_s,
            own_queue,
        )
    finally:
        watcher.stop()
        heartbeat.stop()
        runner.close()
        forget_worker_queue(beat_connection, settings.queue_name, name)
        log.info("worker stopped", extra=fields(worker=name, slot=slot))
    return 0


def forget_worker_queue(connection: redis.Redis, queue_name: str, name: str) -> None:
    """Drop a stopped worker's own queue from RQ's queue set (what is left in it is re-routed)."""
    with contextlib.suppress(redis.RedisError):
        connection.srem(keys.rq_queues(), keys.rq_queue(keys.worker_queue(queue_name, name)))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of one worker process (`python -m sandbox_service.worker.main --slot N`)."""
    parser = argparse.ArgumentParser(prog="rl-sandbox-worker")
    parser.add_argument("--slot", type=int, required=True, help="executor slot index")
    args = parser.parse_args(argv)
    try:
        settings = Settings()
    except UnknownSettingError as exc:
        print(f"rl-sandbox-worker: {exc}", file=sys.stderr)
        return 2
    configure_logging("worker", settings.log_level)
    faulthandler.register(STACK_DUMP_SIGNAL, all_threads=True)
    return run(settings, args.slot)


if __name__ == "__main__":
    sys.exit(main())
