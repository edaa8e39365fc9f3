"""Process control of PID 1: who runs programs (their uid, cgroups, scratch), killing and reaping
every other process, fresh scratch mounts, and the kernel's CPU counts.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import time
from typing import TYPE_CHECKING, Any

from .libc import _libc, fork_lean

if TYPE_CHECKING:
    from collections.abc import Callable

REAP_DEADLINE_S = 10.0
_MAX_SETUP_ERROR_CHARS = 4000
"""Under what a RunReply's setup_error may hold (protocol.py): a long path in an error message
must not make the answer invalid."""
CPU_LIMIT_REACHED_AT = 0.75
"""The share of its CPU-time limit a process must have used for a SIGXCPU to be the limit's.
The kernel checks RLIMIT_CPU against CPU time counted in scheduler ticks, which ran ahead of
the rusage wait4 reports (0.90 s of rusage at a 1 s limit on a loaded VM, measured)."""


def cpu_limit_reached(cpu_s: float, limit_s: float) -> bool:
    """Whether a process that used `cpu_s` (rusage) had reached a CPU-time limit of `limit_s`."""
    return limit_s > 0 and cpu_s >= limit_s * CPU_LIMIT_REACHED_AT


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


_PROGRAM: dict[str, Any] = {"uid": None, "cgroup_fds": [], "scratch": []}
"""Who runs programs, set by main() from its arguments: the program's uid, descriptors of the
run cgroups' cgroup.procs, and the scratch mounts (directory, tmpfs options)."""
_MS_NOSUID_NODEV = 2 | 4
_MNT_DETACH = 2


def become_program() -> None:
    """In a process the zygote forked to run a program (a standby, a session's interpreter, a
    helper writing a session's input files): into the run's cgroups, then the program's uid.

    The move comes first: the descriptors are the worker's (the kernel checks its credentials),
    and they are closed at once, so that no program can write another pid there (PID 1's).
    Leaving uid 0 clears every capability; the zygote keeps its own.
    """
    fds, _PROGRAM["cgroup_fds"] = _PROGRAM["cgroup_fds"], []
    for fd in fds:
        os.write(fd, b"0")  # 0: the writer itself
        os.close(fd)
    uid = _PROGRAM["uid"]
    if uid is not None:
        if os.getgroups():
            os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


def fresh_scratch() -> None:
    """A new, empty tmpfs on each writable directory, the last run's detached with all it held
    (files, their extended attributes, ACLs and times, the directories' own): nothing a run
    wrote there reaches the next. Every process of the last run is dead by now."""
    libc = _libc()
    for target, options in _PROGRAM["scratch"]:
        path = target.encode()
        if (
            libc.umount2(path, _MNT_DETACH) != 0
            or libc.mount(b"tmpfs", path, b"tmpfs", _MS_NOSUID_NODEV, options.encode()) != 0
        ):
            errno = ctypes.get_errno()
            raise OSError(errno, f"cannot mount a fresh {target}: {os.strerror(errno)}")


def _be_the_oom_killers_pick() -> None:
    """The memory limit's OOM killer must pick the program, never the zygote."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    try:
        os.write(fd, b"1000")
    finally:
        os.close(fd)


def _close_all_but(*keep: int) -> None:
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _cpu_of_self_and_children() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_CPUCLOCK_SCHED = 2
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_of_process(pid: int) -> float:
    """CPU seconds of another process and of its waited-for children, as the kernel counts:
    its CPU clock (nanoseconds, every thread) and the cutime/cstime of /proc/<pid>/stat."""
    try:
        own = time.clock_gettime(((~pid) << 3) | _CPUCLOCK_SCHED)
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read(4096).rpartition(b")")[2].split()
        children = (int(fields[13]) + int(fields[14])) / _CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return 0.0
    return own + children


def _kill_all_but(*keep: int) -> float:
    """SIGKILL every process of the namespace but this one and `keep` (the interpreters: this
    kills a cell's background processes); reap the orphans; return their CPU seconds."""
    spared = {"1", *map(str, keep)}
    cpu = 0.0
    deadline = time.monotonic() + REAP_DEADLINE_S
    while True:
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and p not in spared]
        alive = [p for p in others if not _is_zombie(p)]
        if not alive:
            return cpu + _reap_all(block=False)
        if time.monotonic() > deadline:
            raise RuntimeError("processes survived SIGKILL")
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cpu += _reap_all(block=False)
        time.sleep(0.0002)


def _is_zombie(pid: int) -> bool:
    """Dead but not reaped (the interpreter's own children stay so until it waits for them)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read(4096).rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return True  # gone
    return state in (b"Z", b"X")


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read(4096).rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _is_dumpable(pid: int) -> bool:
    """Whether the kernel lets processes of the program's uid at `pid`'s memory and /proc
    files: those of a dumpable process belong to its uid, a non-dumpable one's to root (the
    jail's). /proc/<pid> itself always shows the uid: its files tell. A process gone is not
    (nothing of it to reach)."""
    try:
        return bool(os.stat(f"/proc/{pid}/mem").st_uid == _PROGRAM["uid"])
    except OSError:
        return False


def _is_stopped(pid: int) -> bool:
    """Stopped, or gone (nothing left to stop)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read(4096).rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in (b"T", b"t", b"Z", b"X")


def _as_program[T](work: Callable[[T], None], files: T) -> str | None:
    """Run `work(files)` in a child that is the program's uid (the files it writes are the
    program's to change, and the zygote writes nothing into directories the program owns);
    None, or what went wrong."""
    read_end, write_end = os.pipe()
    pid = fork_lean()
    if pid == 0:
        os.close(read_end)
        try:
            become_program()
            work(files)
            os._exit(0)
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                os.write(write_end, str(exc).encode(errors="replace")[:4096])
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read(4097)
    _, status = os.waitpid(pid, 0)
    if status == 0:
        return None
    return message.decode(errors="replace") or f"the writer ended with status {status}"
