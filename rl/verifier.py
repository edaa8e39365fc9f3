"""A small pool of answer-checking worker processes with a hard time limit per check.

sympy can hang for minutes, in C code that holds the GIL and ignores signals (a big-integer
power such as 9^(9^(9^9))), so neither signal.alarm nor a thread can bound a check. Each check
runs in a worker process (`rl.verify_worker`); when it overruns its limit the worker is SIGKILLed,
answered as a time-out, and replaced by a fresh one in the background. The caller waits on
pipes with a deadline and never on a process.

Bounds: `check` returns within `timeout_s` (plus a few milliseconds) of being called, whatever the
workers are doing, waiting for a ready worker included; so right after several time-outs in a
row, while every worker restarts, it answers "unavailable". In `check_many`, which a trainer
should use, each item gets `timeout_s` from the moment a worker takes it, so restarts delay a
batch but never cost an item its verdict. One lock serialises callers. Create the pool at
start-up: starting a worker costs about 2 s (sympy's import).
Workers are Linux-killed with their parent; create the pool from a long-lived thread (the main
thread), because PR_SET_PDEATHSIG fires when the creating thread exits.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

VerdictStatus = Literal["ok", "timeout", "error", "crashed", "unavailable"]

# `python -m rl.verify_worker` must import this very package, installed or not.
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
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


class _Worker:
    """One worker process and the bytes read from it so far."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            bufsize=0,
            start_new_session=True,  # a Ctrl-C in the trainer's terminal is not ours to act on
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin = self.proc.stdin
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.started_at = time.monotonic()
        self._buffer = b""

    def send(self, message: dict[str, Any]) -> bool:
        """Write one request; False when the worker is gone."""
        try:
            self.stdin.write((json.dumps(message) + "\n").encode())
        except (BrokenPipeError, OSError):
            return False
        return True

    def read(self) -> tuple[list[dict[str, Any]], bool]:
        """Complete messages available now, and whether the worker closed its end (died)."""
        closed = False
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                closed = True
                break
            self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()], closed

    def kill(self) -> None:
        """SIGKILL without waiting; the pool reaps it later."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


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
    ) -> None:
        """Start `workers` processes and wait until each has imported sympy.

        memory_mb is each worker's RLIMIT_AS (None: unlimited). soft_timeout=False leaves the
        SIGKILL at timeout_s as the only limit (tests use it to exercise that path).
        """
        if workers < 1 or timeout_s <= 0 or startup_timeout_s <= 0:
            raise ValueError("need workers >= 1, timeout_s > 0 and startup_timeout_s > 0")
        self.size = workers
        self.timeout_s = timeout_s
        self.rel_tol = rel_tol
        self.startup_timeout_s = startup_timeout_s
        self.soft_timeout = soft_timeout
        self._argv = [sys.executable, "-m", "rl.verify_worker", "--parent-pid", str(os.getpid())]
        self._argv += ["--memory-mb", str(memory_mb or 0)]
        pythonpath = os.environ.get("PYTHONPATH", "")
        self._env = dict(
            os.environ, PYTHONPATH=os.pathsep.join(p for p in (_PACKAGE_ROOT, pythonpath) if p)
        )
        self._lock = threading.Lock()
        self._idle: collections.deque[_Worker] = collections.deque()
        self._starting: list[_Worker] = []
        self._dying: list[subprocess.Popen[bytes]] = []
        self._failed_starts = 0
        self._closed = False
        self.restarts = 0
        """Workers replaced after a time-out or a crash, over the pool's life."""
        for _ in range(workers):
            self._starting.append(_Worker(self._argv, self._env))
        with self._lock:
            self._wait_until_ready()

    # -- public -------------------------------------------------------------------------------

    def check(self, prediction: str, gold: str) -> Verdict:
        """Judge one pair; returns within timeout_s of the call, whatever happens."""
        deadline = time.monotonic() + self.timeout_s
        return self.check_many([(prediction, gold)], deadline=deadline)[0]

    def check_many(
        self, pairs: Iterable[tuple[str, str]], *, deadline: float | None = None
    ) -> list[Verdict]:
        """Judge (prediction, gold) pairs in parallel; each gets timeout_s once a worker takes it.

        deadline (time.monotonic() value) also bounds the whole call: items not finished by
        then are answered as time-outs.
        """
        items = list(pairs)
        with self._lock:
            if self._closed:
                raise VerifierError("the verifier pool is closed")
            return self._run(items, deadline)

    def close(self) -> None:
        """Stop every worker (idle ones by EOF, busy or starting ones by SIGKILL)."""
        with self._lock:
            self._closed = True
            for worker in list(self._idle) + self._starting:
                worker.kill()
                self._dying.append(worker.proc)
            self._idle.clear()
            self._starting.clear()
            for proc in self._dying:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
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
        busy: dict[int, _Job] = {}  # fd -> job
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
                prediction, gold = items[index]
                job_deadline = now + self.timeout_s
                if deadline is not None:
                    job_deadline = min(job_deadline, deadline)
                soft_s = max(0.05, (job_deadline - now) * _SOFT_FRACTION)
                request = {
                    "prediction": prediction,
                    "gold": gold,
                    "rel_tol": self.rel_tol,
                    "soft_timeout_s": soft_s if self.soft_timeout else 0.0,
                }
                if worker.send(request):
                    busy[worker.fd] = _Job(index, worker, now, job_deadline)
                else:
                    self._replace(worker)
                    pending.appendleft(index)
            if pending and not self._idle and not busy and not self._starting:
                self._start_worker()

            wake = [job.deadline for job in busy.values()]
            wake += [w.started_at + self.startup_timeout_s for w in self._starting]
            if deadline is not None:
                wake.append(deadline)
            ready_fds = self._poll([*busy, *(w.fd for w in self._starting)], min(wake) - now)

            for fd in ready_fds:
                if fd in busy:
                    job = busy[fd]
                    messages, closed = job.worker.read()
                    if messages:
                        del busy[fd]
                        reply = messages[0]
                        status = reply.get("status", "error")
                        results[job.index] = Verdict(
                            bool(reply.get("equal", False)) and status == "ok",
                            status if status in ("ok", "timeout", "error") else "error",
                            time.monotonic() - job.started_at,
                        )
                        if closed:
                            self._replace(job.worker)
                        else:
                            self._idle.append(job.worker)
                    elif closed:  # died mid-check: a segfault, or the memory limit
                        del busy[fd]
                        results[job.index] = Verdict(
                            False, "crashed", time.monotonic() - job.started_at
                        )
                        self._replace(job.worker)
            self._collect_started()

            now = time.monotonic()
            for fd, job in list(busy.items()):
                if now >= job.deadline:
                    del busy[fd]
                    results[job.index] = Verdict(False, "timeout", now - job.started_at)
                    self._replace(job.worker)
            self._expire_starting(now)

        return [r if r is not None else Verdict(False, "error", 0.0) for r in results]

    def _poll(self, fds: list[int], timeout_s: float) -> set[int]:
        if not fds:
            time.sleep(max(0.0, min(timeout_s, 0.05)))
            return set()
        poller = select.poll()  # not select.select: a trainer can hold more than 1024 fds
        for fd in fds:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        events = poller.poll(max(0, int(timeout_s * 1000) + 1))
        return {fd for fd, _ in events}

    def _start_worker(self) -> None:
        if self._failed_starts >= _MAX_FAILED_STARTS:
            raise VerifierError(f"{self._failed_starts} verifier workers in a row failed to start")
        self._starting.append(_Worker(self._argv, self._env))

    def _replace(self, worker: _Worker) -> None:
        """Kill a worker (over its limit, or dead) and start its successor in the background."""
        worker.kill()
        self._dying.append(worker.proc)
        self.restarts += 1
        self._start_worker()

    def _collect_started(self) -> None:
        for worker in list(self._starting):
            messages, closed = worker.read()
            if any(m.get("ready") for m in messages):
                self._starting.remove(worker)
                self._idle.append(worker)
                self._failed_starts = 0
            elif closed:
                self._starting.remove(worker)
                worker.kill()
                self._dying.append(worker.proc)
                self._failed_starts += 1
                if self._failed_starts >= _MAX_FAILED_STARTS:
                    raise VerifierError(
                        f"verifier workers keep failing to start (last exit code "
                        f"{worker.proc.poll()}); run `python -m rl.verify_worker --parent-pid 0`"
                    )
                self._start_worker()

    def _expire_starting(self, now: float) -> None:
        late = [w for w in self._starting if now - w.started_at >= self.startup_timeout_s]
        if late:
            for worker in late:
                self._starting.remove(worker)
                worker.kill()
                self._dying.append(worker.proc)
            raise VerifierError(f"a verifier worker did not start in {self.startup_timeout_s} s")

    def _wait_until_ready(self) -> None:
        while self._starting:
            wake = min(w.started_at for w in self._starting) + self.startup_timeout_s
            self._poll([w.fd for w in self._starting], wake - time.monotonic())
            self._collect_started()
            self._expire_starting(time.monotonic())

    def _reap(self) -> None:
        self._dying = [proc for proc in self._dying if proc.poll() is None]
