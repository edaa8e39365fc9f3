"""A session's interpreter (the member of a family): runs cells in one namespace, and forks
copies of itself on the zygote's order.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import sys
import threading
import time
import traceback

from . import protocol
from .child import (
    _fresh_main,
    _install_std_streams,
    _reseed_random,
    _run_source,
    _std_streams,
    seed_random,
)
from .files import WORK_DIR
from .libc import PR_SET_DUMPABLE, _libc, fork_raw
from .outputs import leave_outputs
from .process import (
    _be_the_oom_killers_pick,
    _close_all_but,
    _cpu_of_self_and_children,
    become_program,
)
from .protocol import recv_frame, send_frame

# --- sessions: one persistent interpreter per jail ----------------------------------------------


def session_interpreter(channel: socket.socket) -> None:
    """The session's interpreter: runs cells sent by the zygote in one namespace. Never returns.

    It holds only its private channel to the zygote, never the worker's control socket; the
    cells run in this process, so they can write to the channel, and the zygote believes
    nothing from it but a cell's status (see serve_session).
    """
    try:
        become_program()
        _close_all_but(channel.fileno())
        _libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        _be_the_oom_killers_pick()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(WORK_DIR)
        cwd = WORK_DIR
        _reseed_random()
        namespace = _fresh_main()
        devnull = os.open("/dev/null", os.O_RDWR)
        while True:
            try:
                message, fds = recv_frame(channel, max_fds=FORK_BATCH)
                if message.get("op") == FORK:
                    channel = _fork_interpreter(channel, fds)
                    continue
                limits = protocol.RunLimits.from_wire(message.get("limits"))
            except (EOFError, OSError):
                os._exit(0)
            code_fd, stdin_fd, stdout_fd, stderr_fd = fds
            with os.fdopen(code_fd, "rb") as f:
                source = f.read().decode("utf-8", errors="surrogateescape")
            for target, fd in ((0, stdin_fd), (1, stdout_fd), (2, stderr_fd)):
                os.dup2(fd, target)
                os.close(fd)
            if message.get("moved"):  # a sibling ran on mounts since: ours are new ones
                _enter_again(cwd)
            _install_std_streams(_std_streams())
            _cell_limits(limits)
            seed = message.get("seed")
            seed_random(seed if isinstance(seed, int) else None)
            status = _run_source(source, namespace, cell=True)
            with contextlib.suppress(BaseException):
                cwd = os.getcwd()
            with contextlib.suppress(BaseException):
                leave_outputs()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(BaseException):
                    stream.flush()
            # Let go of this cell's pipes, so the worker sees their end.
            for target in (0, 1, 2):
                os.dup2(devnull, target)
            send_frame(channel, protocol.CellDone(status & 0xFF).to_wire())
    except BaseException:
        traceback.print_exc()
        os._exit(70)


def _enter_again(cwd: str) -> None:
    """Enter the working directory of the last cell by its path (the working directory if it
    is gone): the process's was on a scratch mount detached since (_Family.switch_to)."""
    try:
        os.chdir(cwd)
    except OSError:
        with contextlib.suppress(OSError):
            os.chdir(WORK_DIR)


FORK = "fork"
"""The op of the frame the zygote sends an interpreter between cells to fork it; the one
descriptor with it is the fork's channel."""
FORK_BATCH = 64
"""Copies asked for in one fork frame (one descriptor each, one middle process)."""
HELLO = b"h"
"""A fork's first byte on its channel: the kernel attaches its pid (SCM_CREDENTIALS)."""


def _fork_interpreter(channel: socket.socket, fds: list[int]) -> socket.socket:
    """In an interpreter told to fork: one copy of this process per descriptor passed, each the
    zygote's child (a middle process forks them all and exits, so they are reparented to PID 1)
    serving its descriptor as its channel; the channel this process goes on with (a copy: its
    new one). A copy that cannot be made leaves its descriptor closed: the zygote sees EOF.

    The copies are made by fork(2) itself (fork_raw): none of the program's at-fork handlers
    (os.register_at_fork) runs, here, in the middle or in a copy."""
    # Non-dumpable from here on, this process and its copies: their memory and /proc files are
    # then no sibling's to read or write (the same uid would otherwise be enough); the zygote
    # checks it from the kernel before every cell (_Family.end_dumpable).
    _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    try:
        middle = fork_raw()
    except OSError:  # the pids limit: no copy
        middle = -1
    if middle == 0:
        for mine in fds:
            try:
                copy_pid = fork_raw()
            except OSError:
                os._exit(1)
            if copy_pid == 0:
                for other in fds:
                    if other != mine:
                        os.close(other)
                channel.close()
                return _become_copy(socket.socket(fileno=mine))
        os._exit(0)
    for fd in fds:
        os.close(fd)
    if middle > 0:
        os.waitpid(middle, 0)
    return channel


def _become_copy(copy: socket.socket) -> socket.socket:
    if threading.active_count() != 1:
        # Forked from an interpreter with threads: only this one came along. The threading
        # module's own clean-up (what os.fork would call among its handlers), taken before
        # any program ran, forgets the others.
        _THREADING_AFTER_FORK()
    threading.main_thread()._set_native_id()  # type: ignore[attr-defined]
    deadline = time.monotonic() + FORK_HELLO_DEADLINE_S / 2
    while os.getppid() != 1 and time.monotonic() < deadline:
        time.sleep(0.0002)
    _reseed_random()  # each fork draws its own numbers (a seeded cell seeds them again)
    copy.sendall(HELLO)
    return copy


_THREADING_AFTER_FORK = threading._after_fork  # type: ignore[attr-defined]
"""threading's after-fork clean-up, as the stdlib defines it (before a program could replace it)."""


def _cell_limits(limits: protocol.RunLimits) -> None:
    # RLIMIT_CPU counts the interpreter's whole life and a hard limit cannot be raised again:
    # each cell moves the soft limit to what is used so far plus the cell's budget.
    used = int(_cpu_of_self_and_children()) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + limits.cpu_time_s
    resource.setrlimit(
        resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard)
    )


FORK_HELLO_DEADLINE_S = 10.0
"""How long the zygote waits for each copy's hello (a loaded host delays the middle's exit)."""
