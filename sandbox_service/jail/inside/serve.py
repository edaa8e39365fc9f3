"""A plain run's loop (warm and cold mode): a standby forked ahead takes each request, becomes
the program and runs it; PID 1 supervises it and answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import select
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from typing import Any

from . import protocol
from .child import _reseed_random, prepare_child, run_child, seed_random
from .files import WORK_DIR, _fetch_files, _write_files
from .heap import exercise
from .libc import PR_SET_DUMPABLE, _libc, fork_lean
from .netns import fresh_if_used
from .outputs import take_outputs
from .process import (
    _MAX_SETUP_ERROR_CHARS,
    REAP_DEADLINE_S,
    _be_the_oom_killers_pick,
    _close_all_but,
    _cpu_of_self_and_children,
    _kill_everyone_else,
    become_program,
    cpu_limit_reached,
    fresh_scratch,
)
from .protocol import ABORT, recv_frame

WARM_UP_AFTER_IDLE_S = 0.02


MAX_TAKEN_LINE_BYTES = protocol.MAX_FRAME_BYTES + (1 << 16)
"""A standby's report of the request it took carries the request's fetch list, which came in
a frame: never longer than one, whatever a valid request holds."""


_LOADAVG_FD = [-1]
"""The host's /proc/loadavg, passed by the worker (the jail's /proc has no host-wide files)."""


def host_busy() -> bool:
    """Whether the host's CPUs are all taken now: idle-time work would then slow someone's run.

    Counts the tasks runnable at this instant (the 4th field of /proc/loadavg, which is not
    namespaced), less the caller; the load averages lag by a minute.
    """
    try:
        text = os.pread(_LOADAVG_FD[0], 256, 0).decode()
        runnable = int(text.split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return True
    return runnable - 1 >= (os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class _Taken:
    """standby -> zygote, on a private pipe before the program starts: what the zygote needs
    of the request it took to supervise the run (not the request itself: its input files
    would be encoded, decoded and validated a second time), or why it could not be set up."""

    started: float
    cpu_before_s: float
    """The standby's CPU at the request (its rusage covers its preparation too)."""
    timeout_s: float
    fetch: tuple[str, ...]
    fetch_budget: protocol.FetchBudget
    setup_error: str | None
    cpu_limit_s: float = 0.0
    """The RLIMIT_CPU the program gets, which the kernel compares with the process's whole CPU
    time (its preparation as a standby included)."""

    @classmethod
    def of(cls, started: float, cpu_before_s: float, request: protocol.RunRequest) -> _Taken:
        """What the zygote needs of a valid request."""
        return cls(
            started,
            cpu_before_s,
            request.limits.timeout_s,
            request.fetch,
            request.fetch_budget,
            None,
            request.limits.cpu_time_s,
        )

    def to_line(self) -> bytes:
        wire = {
            "op": "run",
            "started": self.started,
            "cpu_before_s": self.cpu_before_s,
            "timeout_s": self.timeout_s,
            "fetch": list(self.fetch),
            "fetch_budget": self.fetch_budget.to_wire(),
            "setup_error": self.setup_error,
            "cpu_limit_s": self.cpu_limit_s,
        }
        return (json.dumps(wire, ensure_ascii=False) + "\n").encode()

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> _Taken:
        timeout_s = float(obj["timeout_s"])
        if not math.isfinite(timeout_s):
            raise ValueError("timeout_s: not a finite number")
        fetch = obj["fetch"]
        if not isinstance(fetch, list):
            raise ValueError("fetch: expected a list")
        return cls(
            started=float(obj["started"]),
            cpu_before_s=float(obj["cpu_before_s"]),
            timeout_s=timeout_s,
            fetch=tuple(protocol.checked_path(path) for path in fetch),
            fetch_budget=protocol.FetchBudget.from_wire(obj["fetch_budget"]),
            setup_error=None if obj.get("setup_error") is None else str(obj["setup_error"]),
            cpu_limit_s=float(obj.get("cpu_limit_s", 0.0)),
        )


def standby(sock: socket.socket, forward_fd: int, go_fd: int, warm_up: bool) -> None:
    """A pre-forked child: take the next request, tell the zygote, become the program.

    Forking ahead of the request takes the fork (copying the page tables of the preloaded heap)
    off the execution's critical path, and so does prepare_child. A warming standby also runs
    `exercise` and reports `warm` (see _choose_standby). The socket is read only once the
    zygote says go on `go_fd`. Never returns.
    """
    try:
        become_program()
        # Dumpable again (a change of uid, like the zygote, made it not) so that its /proc
        # files are its own to write.
        _libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        _be_the_oom_killers_pick()
        prepare_child()
        if warm_up:
            exercise()
            _send_line(forward_fd, {"op": "warm"})
        go = os.read(go_fd, 1)
        os.close(go_fd)
        if not go:  # the zygote is gone
            os._exit(0)
        # Only now: the scratch directories are mounted afresh between the fork and the go.
        os.chdir(WORK_DIR)
        try:
            message, fds = recv_frame(sock, max_fds=4)
        except (EOFError, OSError):
            message, fds = {"op": "exit"}, []
        started = time.monotonic()
        cpu_before = _cpu_of_self_and_children()
        sock.close()
        if message.get("op") in ("exit", ABORT) and not fds:
            _send_line(forward_fd, {"op": message["op"]})
            os._exit(0)
        request: protocol.RunRequest | None = None
        setup_error = None
        try:
            request = protocol.RunRequest.from_wire(message)
            if len(fds) != 4:
                raise protocol.ProtocolError(f"{len(fds)} descriptors, expected 4")
        except protocol.ProtocolError as exc:
            request, setup_error = None, f"malformed request: {exc}"
        if request is not None:
            try:
                _write_files(request.files)
            except (OSError, ValueError) as exc:
                setup_error = f"could not write input files: {exc}"
        if request is None or setup_error is not None:
            taken = _Taken(started, cpu_before, 0.0, (), protocol.FetchBudget(), setup_error)
        else:
            taken = _Taken.of(started, cpu_before, request)
        data = taken.to_line()
        while data:
            data = data[os.write(forward_fd, data) :]
        if setup_error or request is None:
            os._exit(0)
        code_fd, stdin_fd, stdout_fd, stderr_fd = fds
        os.dup2(stdin_fd, 0)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        # The pipe to the zygote too: the program holds no descriptor of the control path.
        _close_all_but(code_fd)
        if request.seed is not None:
            seed_random(request.seed)
    except BaseException:
        traceback.print_exc()  # to the jail's log: this is our failure, not the program's
        os._exit(70)
    run_child(code_fd, request.limits)


def _send_line(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


class _LineReader:
    """JSON lines from a standby's pipe (`warm`, then the request it took), bounded in length.

    Only the standby writes there, before the program starts; the bound and the validation of
    each line guard against our own bugs all the same.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def read_line(self) -> dict[str, Any] | None:
        """The next line's object; None at end of file or for a line that is not one."""
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > MAX_TAKEN_LINE_BYTES:
                return None
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                return None
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        try:
            value = json.loads(line)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def close(self) -> None:
        os.close(self.fd)


def _wait_child(
    pid: int, deadline: float, sock: socket.socket
) -> tuple[int | None, int | None, float, bool]:
    """Wait for the program's process to end, until the deadline or an abort from the worker.

    Returns (exit code, signal, its CPU seconds, timed out), all from the kernel's wait status
    and rusage.
    """
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            remaining = deadline - time.monotonic()
            ready = select.select([pidfd, sock.fileno()], [], [], max(remaining, 0))[0]
            if pidfd in ready:
                _, status, usage = os.wait4(pid, 0)
                cpu = usage.ru_utime + usage.ru_stime
                if os.WIFSIGNALED(status):
                    return None, os.WTERMSIG(status), cpu, False
                return os.WEXITSTATUS(status), None, cpu, False
            # Out of time, or the worker wrote during a run to abort it (or it went away).
            if sock.fileno() in ready:
                _consume_abort(sock)
            return None, signal.SIGKILL, 0.0, True
    finally:
        os.close(pidfd)


def _consume_abort(sock: socket.socket) -> None:
    """Read the worker's abort frame, so that the next request is read from its start."""
    with contextlib.suppress(EOFError, OSError, ValueError, protocol.ProtocolError):
        recv_frame(sock)


def supervise(pid: int, taken: _Taken, sock: socket.socket) -> protocol.RunReply:
    """Wait for the program to end or time out, kill its whole tree, describe the outcome."""
    exit_code, signum, cpu, timed_out = _wait_child(pid, taken.started + taken.timeout_s, sock)
    wall = time.monotonic() - taken.started
    limit_reached = cpu_limit_reached(cpu, taken.cpu_limit_s)
    # The child's rusage covers its life as a standby too: less what it had used by then.
    if timed_out or signum is not None:
        # The slow paths count the whole tree (on a timeout, the child is reaped there).
        cpu = max(cpu + _kill_everyone_else() - taken.cpu_before_s, 0.0)
    else:
        cpu = max(cpu - taken.cpu_before_s, 0.0)
        # SIGKILL is pending for every other process once kill(-1) returns: none of them runs
        # another instruction of the program, so the answer need not wait for their teardown.
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
    return protocol.RunReply(
        exit_code=exit_code,
        signal=signum,
        timed_out=timed_out,
        cpu_limit_reached=limit_reached,
        wall_time_s=wall,
        cpu_time_s=cpu,
        fetched=_fetch_files(taken.fetch, taken.fetch_budget),
        outputs=take_outputs(),
    )


@dataclass(slots=True)
class _Standby:
    """The zygote's handle on a pre-forked standby."""

    pid: int
    lines: _LineReader
    go_fd: int
    warmed: bool

    def release(self) -> None:
        """Let it take the next request."""
        os.write(self.go_fd, b"g")
        os.close(self.go_fd)

    def discard(self) -> None:
        """Kill it and wait for its end (it never ran a program)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.lines.close()
        os.close(self.go_fd)


def _fork_standby(sock: socket.socket, warm_up: bool = False) -> _Standby:
    _reseed_random()  # for this child alone
    forward_r, forward_w = os.pipe()
    go_r, go_w = os.pipe()
    try:
        pid = fork_lean()
    except OSError:
        for fd in (forward_r, forward_w, go_r, go_w):
            os.close(fd)
        raise
    if pid == 0:
        os.close(forward_r)
        os.close(go_w)
        standby(sock, forward_w, go_r, warm_up)
    os.close(forward_w)
    os.close(go_r)
    return _Standby(pid, _LineReader(forward_r), go_w, warmed=warm_up)


def _choose_standby(sock: socket.socket, clean: _Standby, idle_warm_up: str) -> _Standby:
    """Wait for the next request; the standby that is to take it.

    A forked child writes to many pages of the preloaded heap (reference counts, caches), and
    each first write costs a copy-on-write fault: about half the time of a sympy call. When
    the slot stays idle, a second standby runs `exercise` to take those faults before the
    request comes. The clean standby stays ready meanwhile: a request arriving before the
    warm-up is done goes to it and the warming one is killed, so a warm-up never delays a
    request by more than that kill, and is never interrupted half-way (which could leave a
    library's cache half-written in the process that then runs the program). idle_warm_up:
    "auto" (only while the host's CPUs are not all busy), "always" or "never".
    """
    if idle_warm_up == "never" or select.select([sock], [], [], WARM_UP_AFTER_IDLE_S)[0]:
        return clean
    if idle_warm_up == "auto" and host_busy():
        return clean
    try:
        warming = _fork_standby(sock, warm_up=True)
    except OSError:  # the pids limit leaves no room for a second standby
        return clean
    ready = select.select([sock.fileno(), warming.lines.fd], [], [])[0]
    if warming.lines.fd in ready and warming.lines.read_line() == {"op": "warm"}:
        clean.discard()
        return warming
    warming.discard()  # a request came first (or the warm-up failed)
    return clean


def _reap_all_but(keep: int) -> None:
    """Reap every process of the namespace but this one and `keep`; each has SIGKILL pending.

    Orphans become this process's children as their parents die, so the loop ends once their
    teardowns are done.
    """
    spared = {"1", str(keep)}
    deadline = time.monotonic() + REAP_DEADLINE_S
    while any(p.isdigit() and p not in spared for p in os.listdir("/proc")):
        if time.monotonic() > deadline:
            raise RuntimeError("processes survived SIGKILL")
        reaped = 0
        with contextlib.suppress(ChildProcessError):
            while os.wait4(-1, os.WNOHANG)[0] > 0:
                reaped += 1
        if not reaped:
            time.sleep(0.0002)


def _next_standby(sock: socket.socket) -> _Standby:
    """After an answer: end the last run's processes, wipe its files, fork a new standby.

    The new standby is forked first, so that its fork and preparation overlap the kernel's
    teardown of the last program's address space. kill(-1) before the fork leaves SIGKILL
    pending on every other process, and a process with SIGKILL pending neither returns to its
    program nor forks: nothing of the last run can reach the new standby.
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    # A run that used the loopback leaves its namespace behind: the next standby is born in a
    # fresh one (after the answer; a run that never touched the network pays one read).
    fresh_if_used()
    try:
        ahead: _Standby | None = _fork_standby(sock)
    except OSError:  # EAGAIN: the last run's processes still fill the cgroup's pids limit
        ahead = None
    if ahead is None:
        _kill_everyone_else()
    else:
        _reap_all_but(ahead.pid)
    fresh_scratch()
    return ahead or _fork_standby(sock)


def _take(current: _Standby) -> _Taken | str | None:
    """What the released standby took: a run, ABORT (a stray abort frame), or None (exit, the
    worker gone, or a standby that died or said something unexpected)."""
    line = current.lines.read_line()
    if line is not None and line.get("op") == ABORT:
        return ABORT
    if line is None or line.get("op") != "run":
        return None
    try:
        return _Taken.from_wire(line)
    except (KeyError, TypeError, ValueError):
        return None


def serve(sock: socket.socket, once: bool, idle_warm_up: str) -> None:
    """Answer run requests through pre-forked children until told to exit (cold mode: one)."""
    current = _fork_standby(sock)
    while True:
        current = _choose_standby(sock, current, idle_warm_up)
        current.release()
        taken = _take(current)
        current.lines.close()
        if isinstance(taken, str):
            # An abort that crossed the end of its run on the wire: that run is answered.
            current = _next_standby(sock)
            continue
        if taken is None:
            # Leave, and let the worker's side see the jail end.
            _kill_everyone_else()
            return
        if taken.setup_error is not None:
            reply = protocol.RunReply(setup_error=taken.setup_error[:_MAX_SETUP_ERROR_CHARS])
        else:
            reply = supervise(current.pid, taken, sock)
        reply = dataclasses.replace(reply, warmed=current.warmed)
        sock.sendall(protocol.reply_frame(reply)[1])
        if once:
            _kill_everyone_else()
            return
        current = _next_standby(sock)
