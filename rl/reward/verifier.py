"""A small pool of answer-checking worker processes with a hard time limit per check.

sympy can hang for minutes, in C code that holds the GIL and ignores signals (a big-integer
power such as 9^(9^(9^9))), so neither signal.alarm nor a thread can bound a check. Each check
runs in a worker process (`rl.reward.verify_worker.serve`); when it overruns its limit the worker is
SIGKILLed, answered as a time-out, and replaced. The caller waits on pipes with a deadline,
never on a process.

Workers are forked by multiprocessing's fork server with sympy and math-verify preloaded, so a
replacement is ready in milliseconds, not the seconds an import of sympy takes; the fork server
is a clean process, safe with CUDA and threads in the trainer. The fork server is one per
program: if something else started it first, without our preload, workers import sympy
themselves (same guarantees, slower restarts). When the trainer dies the fork server exits and
the workers with it (PR_SET_PDEATHSIG).

Bounds: `check` returns within `timeout_s` (plus a few milliseconds) of being called, whatever the
workers are doing; if no worker is ready in that time (all restarting) it answers "unavailable".
In `check_many`, which a trainer should use, each item gets `timeout_s` from the moment a worker
takes it, so restarts may delay a batch but never cost an item its verdict. One lock serialises
callers.
"""

from __future__ import annotations

import collections
import multiprocessing
import multiprocessing.connection
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any, Literal

from rl.reward import verify_worker

VerdictStatus = Literal["ok", "timeout", "error", "crashed", "unavailable"]

_PRELOAD = ["rl.reward.verify_worker", "rl.reward.math_equal"]
# The worker's soft timer fires this long before the parent's SIGKILL would, so a check that is
# merely slow in Python code ends without losing the worker.
_SOFT_FRACTION = 0.8
_MAX_FAILED_STARTS = 3


class VerifierError(RuntimeError):
    """The pool itself failed: its workers cannot start. Never raised for a slow or bad answer."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one check."""

    equal: bool
    status: VerdictStatus
    """ok: judged; timeout: over the limit; error: the check raised; crashed: the worker died;
    unavailable: no worker was ready before the deadline (all of them restarting)."""
    elapsed_s: float


@dataclass(slots=True)
class _Worker:
    process: BaseProcess
    conn: Connection
    started_at: float


@dataclass(slots=True)
class _Job:
    index: int
    worker: _Worker
    started_at: float
    deadline: float


class VerifierPool:
    """Worker processes that judge (prediction, gold) pairs, each within `timeout_s`."""

    def __init__(
        self,
        *,
        workers: int = 2,
        timeout_s: float = 5.0,
        rel_tol: float = 1e-6,
        memory_mb: int | None = 4096,
        startup_timeout_s: float = 120.0,
        soft_timeout: bool = True,
        start_method: Literal["forkserver", "spawn"] = "forkserver",
    ) -> None:
        """Start `workers` processes and wait until each can take checks.

        memory_mb is each worker's RLIMIT_AS (None: unlimited). soft_timeout=False leaves the
        SIGKILL at timeout_s as the only limit (tests use it to exercise that path).
        """
        if workers < 1 or timeout_s <= 0 or startup_timeout_s <= 0:
            raise ValueError("need workers >= 1, timeout_s > 0 and startup_timeout_s > 0")
        self.size = workers
        self.timeout_s = timeout_s
        self.rel_tol = rel_tol
        self.memory_mb = memory_mb
        self.startup_timeout_s = startup_timeout_s
        self.soft_timeout = soft_timeout
        self._context: ForkServerContext | SpawnContext
        if start_method == "forkserver":
            self._context = multiprocessing.get_context("forkserver")
            # Takes effect only if the fork server is not running yet (see the module doc).
            self._context.set_forkserver_preload(_PRELOAD)
        else:
            self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._idle: collections.deque[_Worker] = collections.deque()
        self._starting: list[_Worker] = []
        self._dying: list[BaseProcess] = []
        self._failed_starts = 0
        self._closed = False
        self.restarts = 0
        """Workers replaced after a time-out or a crash, over the pool's life."""
        try:
            with self._lock:
                for _ in range(workers):
                    self._start_worker()
                self._wait_until_ready()
        except BaseException:
            self.close()
            raise

    # -- public -------------------------------------------------------------------------------

    def check(self, prediction: str, gold: str) -> Verdict:
        """Judge one pair; returns within timeout_s of the call, whatever happens."""
        deadline = time.monotonic() + self.timeout_s
        return self.check_many([(prediction, gold)], deadline=deadline)[0]

    def check_many(
        self, pairs: Iterable[tuple[str, str]], *, deadline: float | None = None
    ) -> list[Verdict]:
        """Judge (prediction, gold) pairs in parallel; each gets timeout_s once a worker takes it.

        deadline (a time.monotonic() value) also bounds the whole call: items not finished by
        then are answered "timeout", items never started "unavailable".
        """
        items = list(pairs)
        with self._lock:
            if self._closed:
                raise VerifierError("the verifier pool is closed")
            return self._run(items, deadline)

    def worker_pids(self) -> list[int]:
        """Process ids of the workers not busy with a check (all of them between calls)."""
        with self._lock:
            return [w.process.pid for w in [*self._idle, *self._starting] if w.process.pid]

    def close(self) -> None:
        """SIGKILL every worker and reap it; the pool cannot be used afterwards."""
        with self._lock:
            self._closed = True
            for worker in [*self._idle, *self._starting]:
                self._kill(worker)
            self._idle.clear()
            self._starting.clear()
            for process in self._dying:
                process.join(timeout=5)
                if process.exitcode is not None:
                    process.close()
            self._dying.clear()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals (called with the lock held) -------------------------------------------------

    def _run(self, items: Sequence[tuple[str, str]], deadline: float | None) -> list[Verdict]:
        results: list[Verdict | None] = [None] * len(items)
        pending = collections.deque(range(len(items)))
        busy: dict[Connection, _Job] = {}
        call_start = time.monotonic()

        while pending or busy:
            now = time.monotonic()
            self._reap()
            if deadline is not None and now >= deadline:
                for index in pending:
                    results[index] = Verdict(False, "unavailable", now - call_start)
                pending.clear()
                for job in busy.values():
                    self._replace(job.worker)
                    results[job.index] = Verdict(False, "timeout", now - job.started_at)
                busy.clear()
                break
            while pending and self._idle:
                worker = self._idle.popleft()
                index = pending.popleft()
                job_deadline = now + self.timeout_s
                if deadline is not None:
                    job_deadline = min(job_deadline, deadline)
                soft_s = max(0.05, (job_deadline - now) * _SOFT_FRACTION)
                prediction, gold = items[index]
                request = {
                    "prediction": prediction,
                    "gold": gold,
                    "rel_tol": self.rel_tol,
                    "soft_timeout_s": soft_s if self.soft_timeout else 0.0,
                }
                try:
                    worker.conn.send(request)
                except (BrokenPipeError, OSError):  # died while idle
                    self._replace(worker)
                    pending.appendleft(index)
                    continue
                busy[worker.conn] = _Job(index, worker, now, job_deadline)
            if pending and not self._idle and not busy and not self._starting:
                self._start_worker()

            wake = [job.deadline for job in busy.values()]
            wake += [w.started_at + self.startup_timeout_s for w in self._starting]
            if deadline is not None:
                wake.append(deadline)
            ready = multiprocessing.connection.wait(
                [*busy, *(w.conn for w in self._starting)], max(0.0, min(wake) - now)
            )

            for conn in ready:
                job = busy.pop(conn, None)  # type: ignore[call-overload]
                if job is None:
                    continue  # a starting worker: handled below
                reply = self._receive(job.worker)
                elapsed = time.monotonic() - job.started_at
                if reply is None:  # died mid-check: a segfault, or the memory limit
                    results[job.index] = Verdict(False, "crashed", elapsed)
                    self._replace(job.worker)
                    continue
                status: VerdictStatus = "error"
                if reply.get("status") in ("ok", "timeout"):
                    status = reply["status"]
                results[job.index] = Verdict(
                    bool(reply.get("equal")) and status == "ok", status, elapsed
                )
                self._idle.append(job.worker)
            self._collect_started()

            now = time.monotonic()
            for conn, job in list(busy.items()):
                if now >= job.deadline:
                    del busy[conn]
                    results[job.index] = Verdict(False, "timeout", now - job.started_at)
                    self._replace(job.worker)
            self._expire_starting(now)

        return [r if r is not None else Verdict(False, "error", 0.0) for r in results]

    @staticmethod
    def _receive(worker: _Worker) -> dict[str, Any] | None:
        """The worker's next message, or None if it is gone."""
        try:
            message: dict[str, Any] = worker.conn.recv()
        except (EOFError, OSError):
            return None
        return message

    def _start_worker(self) -> None:
        if self._failed_starts >= _MAX_FAILED_STARTS:
            raise VerifierError(f"{self._failed_starts} verifier workers in a row failed to start")
        parent_conn, child_conn = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=verify_worker.serve,
            args=(child_conn, self.memory_mb),
            name="rl-verifier",
            daemon=True,  # multiprocessing terminates it at interpreter exit
        )
        process.start()
        child_conn.close()  # so that our end sees EOF when the worker dies
        self._starting.append(_Worker(process, parent_conn, time.monotonic()))

    def _kill(self, worker: _Worker) -> None:
        """SIGKILL without waiting; the pool reaps it later."""
        if worker.process.exitcode is None:
            worker.process.kill()
        worker.conn.close()
        self._dying.append(worker.process)

    def _replace(self, worker: _Worker) -> None:
        """Kill a worker (over its limit, or dead) and start its successor."""
        self._kill(worker)
        self.restarts += 1
        if not self._closed:
            self._start_worker()

    def _collect_started(self) -> None:
        for worker in list(self._starting):
            if not worker.conn.poll():
                continue
            message = self._receive(worker)
            self._starting.remove(worker)
            if message is not None and message.get("ready"):
                self._idle.append(worker)
                self._failed_starts = 0
                continue
            self._kill(worker)
            self._failed_starts += 1
            if self._failed_starts >= _MAX_FAILED_STARTS:
                worker.process.join(timeout=5)
                raise VerifierError(
                    f"verifier workers keep failing to start (last exit code "
                    f"{worker.process.exitcode})"
                )
            self._start_worker()

    def _expire_starting(self, now: float) -> None:
        late = [w for w in self._starting if now - w.started_at >= self.startup_timeout_s]
        if late:
            for worker in late:
                self._starting.remove(worker)
                self._kill(worker)
            raise VerifierError(f"a verifier worker did not start in {self.startup_timeout_s} s")

    def _wait_until_ready(self) -> None:
        while self._starting:
            wake = min(w.started_at for w in self._starting) + self.startup_timeout_s
            multiprocessing.connection.wait(
                [w.conn for w in self._starting], max(0.0, wake - time.monotonic())
            )
            self._collect_started()
            self._expire_starting(time.monotonic())

    def _reap(self) -> None:
        still = []
        for process in self._dying:
            if process.exitcode is None:  # exitcode polls without blocking
                still.append(process)
            else:
                process.close()
        self._dying = still
