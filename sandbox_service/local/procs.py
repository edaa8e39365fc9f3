"""Child processes that never outlive their parent: spawn, watch, stop in order."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import IO

_PR_SET_PDEATHSIG = 1
DUMP_WAIT_S = 1.0
"""How long a process late at a stop has to write its stacks before it is killed."""


def die_with_parent(parent_pid: int | None = None) -> None:
    """Tie this process to its parent's life: when the parent dies (even by SIGKILL), so does it.

    Use as `preexec_fn` (between fork and exec, from a single-threaded spawner) or call early in
    a child process (multiprocessing) with the parent's pid, which closes the race of a parent
    that died before the request took effect."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(0)


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    stdout: int | IO[bytes] | None = None,
    stderr: int | IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """Start argv in its own process group (terminal Ctrl-C goes to us, who stop children in
    order) and tied to our life."""
    return subprocess.Popen(
        list(argv),
        env=dict(env) if env is not None else None,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        preexec_fn=die_with_parent,  # our spawners are single-threaded
    )


def stop(
    processes: Sequence[subprocess.Popen[bytes]],
    grace_s: float,
    dump_signal: signal.Signals | None = None,
) -> set[int]:
    """SIGTERM each process, wait up to grace_s for all, then SIGKILL the process groups left.

    dump_signal: sent first to each process still running at the deadline, which then has
    DUMP_WAIT_S to write its stacks (faulthandler) before the kill. Returns the pids killed."""
    for proc in processes:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    late = [proc for proc in processes if proc.poll() is None]
    if late and dump_signal is not None:
        for proc in late:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(dump_signal)
        time.sleep(DUMP_WAIT_S)
    for proc in processes:
        # The group also holds anything the child started (e.g. a jail) that is still there.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return {proc.pid for proc in late}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class NotReady(RuntimeError):
    """A service that was started did not become ready."""


def wait_ready(
    url: str,
    timeout_s: float,
    process: subprocess.Popen[bytes] | None = None,
    path: str = "/readyz",
) -> None:
    """Poll GET url+path until it answers 200; NotReady if `process` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise NotReady(f"{url}: the process exited with {process.returncode} before ready")
        try:
            with urllib.request.urlopen(f"{url}{path}", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:  # refused, not ready yet (503 is an HTTPError), timed out
            pass
        time.sleep(0.1)
    raise NotReady(f"{url}{path} did not answer 200 within {timeout_s:.0f} s")


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT (call from the main thread)."""
    event = threading.Event()

    def handler(signum: int, frame: object) -> None:
        event.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return event
