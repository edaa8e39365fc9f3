"""PID 1 of the jail: takes its arguments, shapes its heap, reports Ready and serves plain runs
or a session.
"""

from __future__ import annotations

import itertools
import os
import resource
import signal
import socket
import sys
import time

from . import protocol
from .child import install_seed_hooks, make_children_std_streams
from .heap import Zygote, interpreter_code_on_huge_pages, prepare_heap, zygote_named
from .libc import PR_SET_DUMPABLE, _libc
from .netns import note_baseline
from .outputs import install_matplotlib_hooks
from .process import _PROGRAM
from .protocol import recv_frame, send_frame
from .serve import _LOADAVG_FD, serve
from .session import serve_session

MAX_PENDING_SIGNALS = 256
"""RLIMIT_SIGPENDING of the whole jail. Queued signals are counted per user up the chain of user
namespaces: each jail's count is also charged to the host user that started nsjail (root), under
that user's own limit, so a program queueing signals without bound made the host's root unable
to queue a real-time signal (sigqueue: EAGAIN) while it ran (tests/jail/test_redteam.py)."""


def _take_program_arguments(argv: list[str]) -> None:
    if "--program-uid" in argv:
        _PROGRAM["uid"] = int(argv[argv.index("--program-uid") + 1])
    if "--run-cgroup-fds" in argv:
        fds = argv[argv.index("--run-cgroup-fds") + 1].split(",")
        _PROGRAM["cgroup_fds"] = [int(fd) for fd in fds]
        for fd in _PROGRAM["cgroup_fds"]:
            os.set_inheritable(fd, False)
    _PROGRAM["scratch"] = [
        tuple(value.split(":", 1))
        for flag, value in itertools.pairwise(argv)
        if flag == "--scratch"
    ]


def main() -> None:
    """Entry point inside the jail: `__main__.py --control-fd N [--preload] [--once|--session]`."""
    import gc

    if os.getpid() != 1:
        raise SystemExit("the zygote must be PID 1 of its namespace")
    resource.setrlimit(resource.RLIMIT_SIGPENDING, (MAX_PENDING_SIGNALS,) * 2)
    # Init ignores signals it has no handler for; drop Python's SIGINT handler to stay immune.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    control_fd = int(sys.argv[sys.argv.index("--control-fd") + 1])
    if "--loadavg-fd" in sys.argv:
        _LOADAVG_FD[0] = int(sys.argv[sys.argv.index("--loadavg-fd") + 1])
    _take_program_arguments(sys.argv)
    # Not in the working directory, which is mounted afresh for every run: a cwd there would
    # keep the first run's tmpfs, and its files, alive after it is detached.
    os.chdir("/")
    sock = socket.socket(fileno=control_fd)
    started = time.monotonic()
    immortal = 0
    cache = None
    if "--matplotlib-cache" in sys.argv:
        cache = sys.argv[sys.argv.index("--matplotlib-cache") + 1]
    install_matplotlib_hooks(cache)
    install_seed_hooks()
    make_children_std_streams()
    # Cold mode forks once, which the copy of the interpreter's code (4 ms) would not repay.
    once = "--once" in sys.argv
    if "--preload" in sys.argv:
        zygote: Zygote = "data"
        if "--preload-zygote" in sys.argv:
            zygote = zygote_named(sys.argv[sys.argv.index("--preload-zygote") + 1])
        immortal = prepare_heap(
            full="--preload-full" in sys.argv, huge_code=not once, zygote=zygote
        )
    else:
        gc.collect()
        gc.freeze()
        if not once:
            interpreter_code_on_huge_pages()
    send_frame(sock, protocol.Ready(time.monotonic() - started, immortal).to_wire())
    # Fork nothing before the worker has moved this process into the slot's cgroups: a child
    # forked earlier would stay outside the memory and process limits.
    try:
        if protocol.Control.from_wire(recv_frame(sock)[0]).op != "serve":
            return
    except (EOFError, OSError, protocol.ProtocolError):
        return
    note_baseline()
    if "--session" in sys.argv:
        serve_session(sock)
    else:
        idle_warm_up = "never"
        if "--idle-warm-up" in sys.argv:
            idle_warm_up = sys.argv[sys.argv.index("--idle-warm-up") + 1]
        serve(sock, once=once, idle_warm_up=idle_warm_up)
