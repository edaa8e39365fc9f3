"""The in-jail zygote: PID 1 of one nsjail, forks one child per execution.

This file runs *inside* the jail under the jailed interpreter, with the standard library and the
preloaded scientific stack only; it must not import sandbox_service. The worker imports it too,
for the framing functions, so importing it does nothing.

Protocol (a Unix stream socket on the descriptor named by --control-fd): each message is a
4-byte big-endian length and a JSON body. A `run` request carries four file descriptors
(code memfd, stdin, stdout and stderr pipe write ends) in SCM_RIGHTS on its first byte.

    zygote -> worker  {"ready": true, "preload_s": float, "immortal_objects": int}
    worker -> zygote  {"op": "serve"}      (once the zygote is in the slot's cgroups)
    worker -> zygote  {"op": "run", "limits": {...}, "files": {path: b64}, "fetch": [path]}
    zygote -> worker  {"exit_code", "signal", "timed_out", "wall_time", "cpu_time",
                       "files": {path: b64}, "missing": [path], "file_errors": {path: why},
                       "warmed": bool}      (the standby had done the idle-time warm-up)
    worker -> zygote  {"op": "exit"}

Why PID 1: the kernel ignores SIGKILL sent to a PID namespace's init from inside it, and
`kill(-1, SIGKILL)` from init reaches every other process of the namespace, daemonised
grandchildren included. The zygote is made non-dumpable, so its /proc files belong to root and
its memory cannot be read or written; seccomp denies ptrace and prlimit on other processes.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import importlib
import json
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import time
import traceback
import types
from dataclasses import dataclass
from typing import Any

MAX_FRAME = 64 << 20
WORK_DIR = "/home/sandbox"
SCRATCH_DIRS = (WORK_DIR, "/tmp", "/dev/shm")
PR_SET_DUMPABLE = 4
WARM_UP_AFTER_IDLE_S = 0.02
REAP_DEADLINE_S = 10.0
_HEADER = struct.Struct(">I")


# --- framing, shared with the worker side ---------------------------------------------------


def send_frame(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one length-prefixed JSON message, with file descriptors on its first byte."""
    body = json.dumps(message, separators=(",", ":")).encode()
    data = _HEADER.pack(len(body)) + body
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)


def recv_frame(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """Receive one message and the descriptors sent with it; EOFError when the peer is gone."""
    fds: list[int] = []
    if max_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, max_fds)
    else:
        head = sock.recv(_HEADER.size)
    if not head:
        raise EOFError("control socket closed")
    head += _recv_exact(sock, _HEADER.size - len(head))
    (length,) = _HEADER.unpack(head)
    if length > MAX_FRAME:
        raise ValueError(f"frame of {length} bytes")
    return json.loads(_recv_exact(sock, length)), fds


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("control socket closed mid-frame")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


# --- preloading -----------------------------------------------------------------------------

STDLIB_PRELOAD = (
    *("math", "cmath", "fractions", "decimal", "itertools", "functools", "collections"),
    *("heapq", "bisect", "statistics", "random", "re", "json", "string", "datetime", "time"),
    *("typing", "dataclasses", "copy", "operator", "textwrap", "io", "traceback", "struct"),
    *("array", "enum", "numbers", "hashlib", "base64", "pprint", "threading", "subprocess"),
)


def preload() -> None:
    """Import and exercise the libraries tool calls use, so forked children skip first-use costs."""
    for name in STDLIB_PRELOAD:
        importlib.import_module(name)
    exercise()


# CPython 3.12 never writes the reference count of an "immortal" object (PEP 683): one whose
# count is this value, as the interpreter's own static objects have.
_IMMORTAL_REFCOUNT = 0xFFFFFFFF


def immortalize_heap() -> int:
    """Make every object of the preloaded heap immortal; the number of objects changed.

    A forked child that merely uses a preloaded object (a sympy singleton, a cached expression,
    a numpy ufunc) increments and decrements its reference count, which writes to the page
    that holds it: a copy-on-write fault, a few microseconds each, thousands per sympy call.
    Immortal objects are never written for that, and never freed: the zygote keeps its heap for
    life anyway (gc.freeze), and a child's new objects stay mortal. Done only where the
    representation is the one known here (64-bit CPython 3.12).
    """
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 12):
        return 0
    if sys.maxsize <= 2**32:
        return 0
    import gc

    changed = 0
    seen: set[int] = set()
    pending: list[Any] = gc.get_objects()
    while pending:
        obj = pending.pop()
        address = id(obj)
        if address in seen:
            continue
        seen.add(address)
        refcount = ctypes.c_ssize_t.from_address(address)
        if refcount.value & 0x80000000 == 0:  # not immortal already
            refcount.value = _IMMORTAL_REFCOUNT
            changed += 1
        pending.extend(gc.get_referents(obj))
    return changed


def exercise() -> None:
    """Typical math tool-call work: fills the libraries' caches and touches their memory."""
    try:
        import numpy as np

        a = np.arange(16, dtype=float).reshape(4, 4) + np.eye(4)
        np.linalg.solve(a, np.ones(4))
        np.linalg.eigvals(a)
        np.random.default_rng(0).random(8).sum()
    except ImportError:
        pass
    try:
        import sympy as sp

        x, y = sp.symbols("x y")
        sp.solve(x**2 - 5 * x + 6, x)
        sp.solve([x + y - 3, x - y - 1], [x, y])
        sp.simplify(sp.sin(x) ** 2 + sp.cos(x) ** 2)
        sp.factor(x**3 - 1)
        sp.expand((x + 1) ** 5)
        sp.integrate(x**2, (x, 0, 1))
        sp.diff(sp.exp(x) * sp.sin(x), x)
        sp.limit(sp.sin(x) / x, x, 0)
        sp.Matrix([[1, 2], [3, 4]]).inv()
        sp.nsimplify(0.5)
        sp.Rational(1, 3) + sp.sqrt(2)
        sp.latex(sp.sqrt(x) / 2)
        sp.isprime(97)
        sp.factorint(360)
        sp.N(sp.pi, 20)
    except ImportError:
        pass
    try:
        import mpmath

        mpmath.mp.dps = 15
        mpmath.quad(mpmath.sin, [0, 1])
    except ImportError:
        pass


def host_busy() -> bool:
    """Whether the host's CPUs are all taken now: idle-time work would then slow someone's run.

    Counts the tasks runnable at this instant (the 4th field of /proc/loadavg, which is not
    namespaced), less the caller; the load averages lag by a minute.
    """
    try:
        with open("/proc/loadavg") as f:
            runnable = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return True
    return runnable - 1 >= (os.cpu_count() or 1)


# --- the child: becomes the user's program ---------------------------------------------------


def _set_limits(limits: dict[str, Any]) -> None:
    cpu = int(limits["cpu_time_s"])
    fsize = int(limits["max_file_size_mb"]) * 1024 * 1024
    wanted = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_FSIZE: (fsize, fsize),
        resource.RLIMIT_NOFILE: (int(limits["max_open_files"]),) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for which, (soft, hard) in wanted.items():
        # Never above the jail's own hard limit, which nsjail set and nothing can raise.
        _, jail_hard = resource.getrlimit(which)
        if jail_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, jail_hard), min(hard, jail_hard)
        resource.setrlimit(which, (soft, hard))


def _fresh_std_streams() -> None:
    sys.stdin = open(0, encoding="utf-8", errors="strict", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", errors="strict", closefd=False)  # noqa: SIM115
    sys.stderr = open(  # noqa: SIM115
        2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1
    )
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]


def _exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def prepare_child() -> dict[str, Any]:
    """In a pre-forked child, before any request: everything that does not depend on it.

    Done while the slot is idle, so the copy-on-write page faults of this work stay off the
    execution's critical path; returns the fresh __main__ namespace.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(WORK_DIR)
    _reseed_random()
    _fresh_std_streams()  # objects over fds 0-2; the request's pipes are dup2'd under them
    namespace = _fresh_main()
    # Touch the compile, exec and print paths once.
    exec(compile("_ = repr([1, 'a', 2.0])", "<warm-up>", "exec"), {"__builtins__": __builtins__})
    return namespace


def run_child(
    code_fd: int, limits: dict[str, Any], namespace: dict[str, Any], status_fd: int
) -> None:
    """In the child, once its request came: limits, the program, its status. Never returns."""
    status = 1
    try:
        with os.fdopen(code_fd, "rb") as f:
            source = f.read().decode("utf-8", errors="surrogateescape")
        _set_limits(limits)
        status = _run_source(source, namespace)
    except BaseException:
        try:
            traceback.print_exc()
        finally:
            status = 1
    finally:
        status = _flush_and_finish(status)
        _report_exit(status_fd, status)
        os._exit(status)


_CPU_AT_REQUEST = [0.0]


def _report_exit(status_fd: int, status: int) -> None:
    # Tell the zygote the status before exiting: the kernel's teardown of this large address
    # space takes milliseconds, and nothing of the program can run after this point. The
    # program's pipes are closed first, so the worker sees their end without waiting for it.
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            os.close(fd)
    cpu = _cpu_of_self_and_children() - _CPU_AT_REQUEST[0]
    with contextlib.suppress(OSError):
        os.write(status_fd, (json.dumps({"exit": status, "cpu": cpu}) + "\n").encode())


def _reseed_random() -> None:
    # A forked child inherits the zygote's PRNG states: every execution would draw the same
    # numbers. `random` reseeds itself at fork; numpy's legacy global state does not.
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _fresh_main() -> dict[str, Any]:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    sys.path.insert(0, "")  # as `python -c`: the working directory is importable
    return main.__dict__


def _run_source(source: str, namespace: dict[str, Any] | None = None, cell: bool = False) -> int:
    """Run a program (or a notebook cell) like the interpreter would; return its exit status."""
    if namespace is None:
        namespace = _fresh_main()
    _forget_scratch_listings()
    try:
        if cell:
            _run_cell(source, namespace)
        else:
            exec(compile(source, "<string>", "exec"), namespace)
    except SystemExit as exc:
        return _exit_code_of(exc)
    except BaseException as exc:
        # Drop this function's own frame: the traceback starts at the program, as with `python -c`.
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None
        traceback.print_exception(type(exc), exc, tb)
        return 1
    return 0


def _forget_scratch_listings() -> None:
    """Drop the import system's cached listings of the writable directories, where the program's
    input files (or an earlier cell's) may have appeared. The rest of sys.path is read-only:
    importlib.invalidate_caches() would cost 0.8 ms of a fresh child's copy-on-write faults."""
    for path, finder in list(sys.path_importer_cache.items()):
        invalidate = getattr(finder, "invalidate_caches", None)
        if invalidate and any(path == top or path.startswith(top + "/") for top in SCRATCH_DIRS):
            invalidate()


def _run_cell(source: str, namespace: dict[str, Any]) -> None:
    """Notebook semantics: run the statements, print the repr of a last expression not None."""
    import ast

    tree = ast.parse(source, "<cell>", "exec")
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
        if value is not None:
            print(repr(value))


def _flush_and_finish(status: int) -> int:
    import atexit
    import threading

    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # wait for non-daemon threads
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = status or 120  # the interpreter's status when flushing stdout fails
    return status


# --- the zygote: PID 1 ------------------------------------------------------------------------


def _kill_everyone_else() -> float:
    """SIGKILL every process of the namespace but this one, reap them all, return their CPU."""
    cpu = 0.0
    for _ in range(100):
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        cpu += _reap_all(block=True)
        if not any(p.isdigit() and p != "1" for p in os.listdir("/proc")):
            return cpu
    raise RuntimeError("processes survived kill(-1)")


def _reap_all(block: bool) -> float:
    """Reap children (orphans included); return the CPU seconds of those reaped."""
    cpu = 0.0
    while True:
        try:
            pid, _status, usage = os.wait4(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return cpu
        if pid == 0:
            return cpu
        cpu += usage.ru_utime + usage.ru_stime


def _wipe_scratch() -> None:
    for top in SCRATCH_DIRS:
        if os.path.isdir(top):
            _wipe_dir(top)


def _wipe_dir(path: str) -> None:
    try:
        os.chmod(path, 0o700)
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                _wipe_dir(entry.path)
                os.rmdir(entry.path)
            else:
                os.unlink(entry.path)
        except FileNotFoundError:
            pass
    if path in SCRATCH_DIRS:
        os.chmod(path, 0o1777 if path != WORK_DIR else 0o755)


def _open_beneath(rel_path: str, flags: int, create_dirs: bool = False) -> int:
    """Open a path under the working directory without following any symlink."""
    parts = rel_path.split("/")
    if not parts or any(p in ("", ".", "..") for p in parts) or rel_path.startswith("/"):
        raise ValueError("not a relative path inside the working directory")
    dir_fd = os.open(WORK_DIR, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            if create_dirs:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=dir_fd)
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = next_fd
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _write_files(files: dict[str, Any]) -> None:
    for rel_path, b64 in files.items():
        fd = _open_beneath(rel_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, create_dirs=True)
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(b64))


def _fetch_files(
    paths: list[str], max_bytes: int
) -> tuple[dict[str, str], list[str], dict[str, str]]:
    found: dict[str, str] = {}
    missing: list[str] = []
    errors: dict[str, str] = {}
    for rel_path in paths:
        try:
            fd = _open_beneath(rel_path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            missing.append(rel_path)
            continue
        except OSError as exc:
            # ELOOP (a symlink), ENOTDIR: never followed out of the working directory.
            errors[rel_path] = f"{type(exc).__name__}: {exc.strerror}"
            continue
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                errors[rel_path] = "not a regular file"
                continue
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            errors[rel_path] = f"larger than {max_bytes} bytes"
            continue
        found[rel_path] = base64.b64encode(data).decode()
    return found, missing, errors


def standby(sock: socket.socket, forward_fd: int, go_fd: int, warm_up: bool) -> None:
    """A pre-forked child: take the next request, tell the zygote, become the program.

    Forking ahead of the request takes the fork (copying the page tables of the preloaded heap)
    off the execution's critical path, and so does prepare_child. A warming standby also runs
    `exercise` and reports `warm` (see _choose_standby). The socket is read only once the
    zygote says go on `go_fd`. Never returns.
    """
    try:
        # Dumpable again (the zygote is not) so that its /proc files are its own to write.
        _libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        with open("/proc/self/oom_score_adj", "w") as f:
            # The memory limit's OOM killer must pick the program, never the zygote.
            f.write("1000")
        namespace = prepare_child()
        if warm_up:
            exercise()
            _send_line(forward_fd, {"op": "warm"})
        go = os.read(go_fd, 1)
        os.close(go_fd)
        if not go:  # the zygote is gone
            os._exit(0)
        _reseed_random()
        try:
            request, fds = recv_frame(sock, max_fds=4)
        except (EOFError, OSError):
            request, fds = {"op": "exit"}, []
        started = time.monotonic()
        _CPU_AT_REQUEST[0] = _cpu_of_self_and_children()
        sock.close()
        if request.get("op") != "run" or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            _send_line(forward_fd, {"op": request.get("op") or "malformed"})
            os._exit(0)
        setup_error = None
        try:
            _write_files(request.get("files", {}))
        except (OSError, ValueError) as exc:
            setup_error = f"could not write input files: {exc}"
        _send_line(
            forward_fd,
            {
                "op": "run",
                "started": started,
                "limits": request["limits"],
                "fetch": request.get("fetch", []),
                "max_fetch_bytes": request.get("max_fetch_bytes", 16 << 20),
                "setup_error": setup_error,
            },
        )
        if setup_error:
            os._exit(0)
        code_fd, stdin_fd, stdout_fd, stderr_fd = fds
        os.dup2(stdin_fd, 0)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        _close_all_but(code_fd, forward_fd)
    except BaseException:
        traceback.print_exc()  # to the jail's log: this is our failure, not the program's
        os._exit(70)
    run_child(code_fd, request["limits"], namespace, forward_fd)


def _close_all_but(*keep: int) -> None:
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _send_line(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


class _LineReader:
    """JSON lines from a child's pipe (the request it took, then its exit status)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""

    def buffered_line(self) -> bool:
        """Whether a whole line is already buffered."""
        return b"\n" in self._buffer

    def read_line(self) -> dict[str, Any] | None:
        """The next line; None at end of file (the child is gone or closed it)."""
        while b"\n" not in self._buffer:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        os.close(self.fd)


def _wait_child(
    pid: int, deadline: float, sock: socket.socket, lines: _LineReader
) -> tuple[int | None, int | None, float, bool]:
    """Wait for the child's exit (its own report, or its death) until the deadline.

    Returns (exit code, signal, cpu seconds, timed out).
    """
    pidfd = os.pidfd_open(pid)
    watched = [lines.fd, pidfd, sock.fileno()]
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, signal.SIGKILL, 0.0, True
            ready = (
                [lines.fd]
                if lines.buffered_line()
                else select.select(watched, [], [], remaining)[0]
            )
            if lines.fd in ready:
                try:
                    report = lines.read_line()
                except (ValueError, OSError):
                    report = None
                if report is not None and isinstance(report.get("exit"), int):
                    return int(report["exit"]) & 0xFF, None, float(report.get("cpu", 0.0)), False
                watched.remove(lines.fd)  # no (valid) report: the pidfd tells how it ended
                continue
            if pidfd in ready:
                _, status, usage = os.wait4(pid, 0)
                cpu = usage.ru_utime + usage.ru_stime
                if os.WIFSIGNALED(status):
                    return None, os.WTERMSIG(status), cpu, False
                return os.WEXITSTATUS(status), None, cpu, False
            if sock.fileno() in ready:
                # The worker only writes during a run to abort it (or it went away).
                return None, signal.SIGKILL, 0.0, True
    finally:
        os.close(pidfd)


def supervise(
    pid: int, request: dict[str, Any], sock: socket.socket, lines: _LineReader
) -> dict[str, Any]:
    """Wait for the program to end or time out, kill its whole tree, describe the outcome."""
    limits = request["limits"]
    started = float(request["started"])
    exit_code, signum, cpu, timed_out = _wait_child(
        pid, started + float(limits["timeout_s"]), sock, lines
    )
    wall = time.monotonic() - started
    if timed_out or signum is not None:
        cpu += _kill_everyone_else()  # the slow paths also count what the tree burned
    else:
        # SIGKILL is pending for every other process once kill(-1) returns: none of them runs
        # another instruction of the program, so the answer need not wait for their teardown.
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
    fetched, missing, errors = _fetch_files(request["fetch"], int(request["max_fetch_bytes"]))
    return {
        "timed_out": timed_out,
        "wall_time": wall,
        "cpu_time": cpu,
        "exit_code": exit_code,
        "signal": signum,
        "files": fetched,
        "missing": missing,
        "file_errors": errors,
    }


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
    forward_r, forward_w = os.pipe()
    go_r, go_w = os.pipe()
    try:
        pid = os.fork()
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
    try:
        ahead: _Standby | None = _fork_standby(sock)
    except OSError:  # EAGAIN: the last run's processes still fill the cgroup's pids limit
        ahead = None
    if ahead is None:
        _kill_everyone_else()
    else:
        _reap_all_but(ahead.pid)
    _wipe_scratch()
    return ahead or _fork_standby(sock)


def serve(sock: socket.socket, once: bool, idle_warm_up: str) -> None:
    """Answer run requests through pre-forked children until told to exit (cold mode: one)."""
    current = _fork_standby(sock)
    while True:
        current = _choose_standby(sock, current, idle_warm_up)
        current.release()
        request = current.lines.read_line()
        op = request["op"] if request is not None else None
        if op != "run":
            current.lines.close()
            if op == "malformed":
                send_frame(sock, {"setup_error": "malformed request"})
                current = _next_standby(sock)
                continue
            # "exit", the worker gone, or a standby that died unexpectedly: leave, and let the
            # worker's side see the jail end.
            _kill_everyone_else()
            return
        assert request is not None
        if request["setup_error"]:
            result = {"setup_error": request["setup_error"]}
        else:
            result = supervise(current.pid, request, sock, current.lines)
        current.lines.close()
        result["warmed"] = current.warmed
        send_frame(sock, result)
        if once:
            _kill_everyone_else()
            _wipe_scratch()
            return
        current = _next_standby(sock)


# --- sessions: one persistent interpreter per jail ----------------------------------------------


def session_interpreter(channel: socket.socket) -> None:
    """The session's interpreter: runs cells sent by the zygote in one namespace. Never returns.

    It holds only its private channel to the zygote, never the worker's control socket.
    """
    try:
        _libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(WORK_DIR)
        _reseed_random()
        namespace = _fresh_main()
        devnull = os.open("/dev/null", os.O_RDWR)
        while True:
            try:
                request, fds = recv_frame(channel, max_fds=4)
            except (EOFError, OSError):
                os._exit(0)
            code_fd, stdin_fd, stdout_fd, stderr_fd = fds
            with os.fdopen(code_fd, "rb") as f:
                source = f.read().decode("utf-8", errors="surrogateescape")
            for target, fd in ((0, stdin_fd), (1, stdout_fd), (2, stderr_fd)):
                os.dup2(fd, target)
                os.close(fd)
            _fresh_std_streams()
            _cell_limits(request["limits"])
            before = _cpu_of_self_and_children()
            status = _run_source(source, namespace, cell=True)
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(BaseException):
                    stream.flush()
            # Let go of this cell's pipes, so the worker sees their end.
            for target in (0, 1, 2):
                os.dup2(devnull, target)
            send_frame(
                channel,
                {"op": "done", "exit_code": status, "cpu": _cpu_of_self_and_children() - before},
            )
    except BaseException:
        traceback.print_exc()
        os._exit(70)


def _cell_limits(limits: dict[str, Any]) -> None:
    # RLIMIT_CPU counts the interpreter's whole life and a hard limit cannot be raised again:
    # each cell moves the soft limit to what is used so far plus the cell's budget.
    used = int(_cpu_of_self_and_children()) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + int(limits["cpu_time_s"])
    resource.setrlimit(
        resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard)
    )


def _cpu_of_self_and_children() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def serve_session(sock: socket.socket) -> None:
    """Run cells in one persistent interpreter until told to exit, or until a cell kills it.

    A cell that times out, or whose interpreter dies, ends the jail after its answer: the worker
    then rebuilds the session elsewhere by replaying its recorded cells.
    """
    channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        sock.close()
        channel.close()
        session_interpreter(theirs)
    theirs.close()
    pidfd = os.pidfd_open(pid)
    while True:
        try:
            request, fds = recv_frame(sock, max_fds=4)
        except EOFError:
            break
        if request.get("op") != "run" or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            if request.get("op") == "exit":
                break
            send_frame(sock, {"setup_error": "malformed request"})
            continue
        try:
            _write_files(request.get("files", {}))
        except (OSError, ValueError) as exc:
            for fd in fds:
                os.close(fd)
            send_frame(sock, {"setup_error": f"could not write input files: {exc}"})
            continue
        started = time.monotonic()
        send_frame(channel, {"op": "cell", "limits": request["limits"]}, fds)
        for fd in fds:
            os.close(fd)
        result, interpreter_alive = _supervise_cell(
            pid, pidfd, channel, sock, started + float(request["limits"]["timeout_s"])
        )
        result["wall_time"] = time.monotonic() - started
        fetched, missing, errors = _fetch_files(
            request.get("fetch", []), int(request.get("max_fetch_bytes", 16 << 20))
        )
        result.update(files=fetched, missing=missing, file_errors=errors)
        result["session_alive"] = interpreter_alive
        if not interpreter_alive:
            result["cpu_time"] += _kill_everyone_else()
        send_frame(sock, result)
        if not interpreter_alive:
            return
    _kill_everyone_else()


def _supervise_cell(
    pid: int, pidfd: int, channel: socket.socket, sock: socket.socket, deadline: float
) -> tuple[dict[str, Any], bool]:
    watched = [channel.fileno(), pidfd, sock.fileno()]
    while True:
        remaining = deadline - time.monotonic()
        ready = select.select(watched, [], [], remaining)[0] if remaining > 0 else []
        if channel.fileno() in ready:
            try:
                done, _ = recv_frame(channel)
            except (EOFError, OSError, ValueError):
                watched.remove(channel.fileno())  # the interpreter is going: its pidfd tells how
                continue
            return {
                "exit_code": int(done.get("exit_code", 1)),
                "signal": None,
                "timed_out": False,
                "cpu_time": float(done.get("cpu", 0.0)),
            }, True
        if pidfd in ready:
            _, status, usage = os.wait4(pid, 0)
            ended = {"timed_out": False, "cpu_time": usage.ru_utime + usage.ru_stime}
            if os.WIFSIGNALED(status):
                return {**ended, "exit_code": None, "signal": os.WTERMSIG(status)}, False
            return {**ended, "exit_code": os.WEXITSTATUS(status), "signal": None}, False
        # Out of time, or the worker wrote during a cell (an abort, or it went away).
        return {"exit_code": None, "signal": signal.SIGKILL, "timed_out": True, "cpu_time": 0.0}, (
            False
        )


def main() -> None:
    """Entry point inside the jail: `zygote.py --control-fd N [--preload] [--once|--session]`."""
    import gc

    if os.getpid() != 1:
        raise SystemExit("the zygote must be PID 1 of its namespace")
    # Init ignores signals it has no handler for; drop Python's SIGINT handler to stay immune.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    control_fd = int(sys.argv[sys.argv.index("--control-fd") + 1])
    sock = socket.socket(fileno=control_fd)
    started = time.monotonic()
    immortal = 0
    if "--preload" in sys.argv:
        preload()
        gc.collect()
        immortal = immortalize_heap()
    gc.collect()
    gc.freeze()  # keep the preloaded heap's pages shared with the children (no gc writes)
    send_frame(
        sock,
        {"ready": True, "preload_s": time.monotonic() - started, "immortal_objects": immortal},
    )
    # Fork nothing before the worker has moved this process into the slot's cgroups: a child
    # forked earlier would stay outside the memory and process limits.
    if recv_frame(sock)[0].get("op") != "serve":
        return
    if "--session" in sys.argv:
        serve_session(sock)
    else:
        idle_warm_up = "never"
        if "--idle-warm-up" in sys.argv:
            idle_warm_up = sys.argv[sys.argv.index("--idle-warm-up") + 1]
        serve(sock, once="--once" in sys.argv, idle_warm_up=idle_warm_up)


if __name__ == "__main__":
    main()
