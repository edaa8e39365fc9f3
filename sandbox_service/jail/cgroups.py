"""The cgroups of one executor slot: memory, process and CPU limits for each execution.

A slot's cgroup has two children: `zygote`, where the worker moves the zygote after it has
preloaded (its preloaded pages stay charged where they were: charges do not move with a
process), and `run`, which holds the limits and counters of each execution. Every process the
zygote forks to run a program (a standby, a session's interpreter) moves itself into `run`
first thing, through a descriptor of `run`'s `cgroup.procs` that the worker opened and passed
into the jail (the kernel checks the opener's credentials). So each execution's limit covers
what that execution allocates (the program, its children, its tmpfs files), and the memory
limit's OOM killer, which chooses only among the processes of the cgroup at its limit, can
never pick the zygote, whatever oom_score_adj a program writes. The CPU limit is the slot's,
over both.

Both hierarchies are supported, found at start-up: cgroup v1 (one tree per controller: memory,
pids, and cpu where mounted) and cgroup v2 (one tree; the worker creates `<parent>` and delegates
+memory +pids +cpu to it itself, see cgroup_delegation.py).
Units: the kernel's files take bytes and microseconds; this module's API takes MiB and cores.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox_service.jail.cgroup_delegation import DelegationError, delegate_parent

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids")
V1_OPTIONAL = ("cpu",)
"""Mounted on most v1 hosts; only a CPU limit needs it."""
MIB = 1024 * 1024
V1_TCP_BUFFER_LIMIT_BYTES = 64 * MIB
"""cgroup v1: the jail's TCP socket buffers together (loopback connections). v1 charges them to
a memory cgroup only once its `memory.kmem.tcp.limit_in_bytes` is set, and then to a counter of
their own; without it a program's unread loopback data is host memory outside every limit
(gigabytes: tests/jail/test_redteam.py). v2 charges them to memory.current."""
CPU_PERIOD_US = 100_000
"""The CFS period of a CPU limit: the kernel's default, short enough that a throttled slot
waits at most a tenth of a second for its next share."""
CPU_MIN_QUOTA_US = 1_000
"""The kernel refuses a quota under 1 ms per period."""
ZYGOTE = "zygote"
RUN = "run"
"""The children of a slot's cgroup (memory and pids; v1's cpu hierarchy has the slot alone)."""


class CgroupUnavailable(RuntimeError):
    """The host lacks the memory and pids controllers, or we may not write them."""


@dataclass(frozen=True, slots=True)
class CgroupUsage:
    """Counters of one execution."""

    peak_memory_mb: float | None
    oom_killed: bool


@dataclass(frozen=True, slots=True)
class CpuThrottling:
    """The CFS bandwidth counters of a slot (cumulative since the cgroup was created)."""

    periods: int
    """Enforcement periods in which the cgroup had runnable work."""
    throttled_periods: int
    """Periods in which it used up its quota and was stopped until the next one."""
    throttled_us: int
    """Total time its threads spent stopped."""


def cpu_max_line(cores: float | None) -> str:
    """The cpu.max value (v2) of a limit of `cores` CPUs: "<quota_us> <period_us>" or "max"."""
    if cores is None:
        return f"max {CPU_PERIOD_US}"
    if not (cores > 0 and math.isfinite(cores)):
        raise ValueError(f"a CPU limit must be positive and finite, got {cores}")
    return f"{max(CPU_MIN_QUOTA_US, round(cores * CPU_PERIOD_US))} {CPU_PERIOD_US}"


def _keyed_value(text: str, key: str) -> int:
    """The value of `key` in a flat keyed file such as memory.events or memory.oom_control."""
    found = _key_pattern(key).search(text)
    return int(found.group(1)) if found else 0


@functools.cache
def _key_pattern(key: str) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(key)} (-?\d+)$", re.MULTILINE)


_STAT_BYTES = 16 << 10
"""More than memory.stat holds (about 1 KiB on cgroup v1, 2-3 KiB on v2)."""


class _KernelFile:
    """A cgroup file read (and written) on every execution: opened once, then pread/pwrite."""

    def __init__(self, path: Path, writable: bool = False) -> None:
        self.path = path
        self._flags = os.O_RDWR if writable else os.O_RDONLY
        self._fd: int | None = None

    def _descriptor(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, self._flags | os.O_CLOEXEC)
        return self._fd

    def read(self, size: int = 4096) -> str:
        return os.pread(self._descriptor(), size, 0).decode()

    def write(self, value: str) -> None:
        os.pwrite(self._descriptor(), value.encode(), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def is_v2(root: Path = CGROUP_ROOT) -> bool:
    """Whether the host mounts the unified (v2) hierarchy at the root."""
    return (root / "cgroup.controllers").exists()


class SlotCgroups:
    """The memory + pids cgroup(s) owned by one executor slot of one worker process.

    Every execution's memory limit is the post-preload baseline plus its own memory_mb, so
    nothing a run leaves charged raises the next one's (in a session: cell after cell).
    whole_life marks a session's cgroups (kept for the names of logs and tests).
    """

    def __init__(
        self, parent: str, name: str, whole_life: bool = False, root: Path = CGROUP_ROOT
    ) -> None:
        self.v2 = is_v2(root)
        if self.v2:
            self.dirs = {"unified": root / parent / name}
            slot = self.dirs["unified"]
            self._memory = self._pids = slot / RUN
            self._cpu = slot
            self._zygote_dirs = [slot / ZYGOTE]
        else:
            controllers = V1_CONTROLLERS + tuple(c for c in V1_OPTIONAL if (root / c).is_dir())
            self.dirs = {c: root / c / parent / name for c in controllers}
            self._memory, self._pids = self.dirs["memory"] / RUN, self.dirs["pids"] / RUN
            self._cpu = self.dirs.get("cpu", root / "cpu" / parent / name)
            self._zygote_dirs = [self.dirs[c] / ZYGOTE for c in V1_CONTROLLERS]
            self._zygote_dirs += [self.dirs[c] for c in V1_OPTIONAL if c in self.dirs]
        self.run_dirs = sorted({self._memory, self._pids})
        """The run's cgroups: each execution's processes move themselves in (run_procs_fds)."""
        self._parent = parent
        self._root = root
        self._whole_life = whole_life
        if self.v2:
            self._usage_file = _KernelFile(self._memory / "memory.current")
            self._oom_file = _KernelFile(self._memory / "memory.events")
        else:
            self._usage_file = _KernelFile(self._memory / "memory.usage_in_bytes")
            self._oom_file = _KernelFile(self._memory / "memory.oom_control")
            self._max_usage_file = _KernelFile(
                self._memory / "memory.max_usage_in_bytes", writable=True
            )
        self._stat_file = _KernelFile(self._memory / "memory.stat")  # read after every run
        self._baseline_bytes: int | None = None
        self._baseline_unreclaimable = 0
        self._limit_bytes = -1
        self._pids_max = -1
        self._cpu_line: str | None = None
        self._oom_kills_before = 0
        self._peak_fd: int | None = None

    # --- files that differ between v1 and v2 ---------------------------------------------------

    def _usage_bytes(self) -> int:
        return int(self._usage_file.read())

    def _oom_kills(self) -> int:
        return _keyed_value(self._oom_file.read(), "oom_kill")

    def create(self) -> None:
        """Create the cgroups (idempotent); CgroupUnavailable with the reason if we cannot."""
        if self.v2:
            try:
                delegate_parent(self._parent, self._root)
            except DelegationError as exc:
                raise CgroupUnavailable(f"cgroup v2: {exc}") from exc
        else:
            for controller in V1_CONTROLLERS:
                if not (self._root / controller).is_dir():
                    raise CgroupUnavailable(
                        f"cgroup v1 controller {controller!r} is not mounted at {self._root}"
                    )
        try:
            for path in self.dirs.values():
                path.mkdir(parents=True, exist_ok=True)
            if self.v2:
                # Controllers for the two children; the slot itself then holds no process (v2).
                (self.dirs["unified"] / "cgroup.subtree_control").write_text("+memory +pids")
            for path in (*self._zygote_dirs, *self.run_dirs):
                path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CgroupUnavailable(
                f"cannot create the cgroups of {self._parent}: {exc} (workers must run as root)"
            ) from exc
        if self.v2:
            with contextlib.suppress(OSError):
                (self._memory / "memory.swap.max").write_text("0")
            self._limit_bytes = -1
        else:
            self._limit_bytes = int((self._memory / "memory.limit_in_bytes").read_text())
            with contextlib.suppress(OSError):
                (self._memory / "memory.swappiness").write_text("0")
            tcp_limit = self._memory / "memory.kmem.tcp.limit_in_bytes"
            if tcp_limit.exists():  # before any socket of the jail exists: only those are charged
                tcp_limit.write_text(str(V1_TCP_BUFFER_LIMIT_BYTES))

    def add_process(self, pid: int) -> None:
        """Move the zygote (all its threads) into the slot's zygote cgroups."""
        for path in self._zygote_dirs:
            (path / "cgroup.procs").write_text(str(pid))
        self._baseline_bytes = self._usage_bytes()
        self._baseline_unreclaimable = self.unreclaimable_bytes()

    def limit_zygote_memory(self, limit_bytes: int) -> None:
        """A hard memory limit on the slot's zygote cgroup: what the zygote charges after it
        was moved there (its copy-on-write copies of its own heap, its bookkeeping) stays
        under it, and an overrun ends that jail (the kernel's OOM kill of PID 1), never the
        host's memory."""
        zygote = self._memory.parent / ZYGOTE
        if self.v2:
            (zygote / "memory.max").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):
                (zygote / "memory.swap.max").write_text("0")
            return
        limit_file = zygote / "memory.limit_in_bytes"
        memsw = zygote / "memory.memsw.limit_in_bytes"
        # memsw must stay >= the memory limit: raise it first when growing, after when
        # shrinking (a slot's cgroup serves jail after jail).
        growing = limit_bytes > int(limit_file.read_text())
        if memsw.exists() and growing:
            memsw.write_text(str(limit_bytes))
        limit_file.write_text(str(limit_bytes))
        if memsw.exists() and not growing:
            memsw.write_text(str(limit_bytes))

    def zygote_memory_limit_bytes(self) -> int | None:
        """The zygote cgroup's hard memory limit (None: unlimited)."""
        zygote = self._memory.parent / ZYGOTE
        text = (zygote / ("memory.max" if self.v2 else "memory.limit_in_bytes")).read_text()
        limit = None if text.strip() == "max" else int(text)
        # cgroup v1 spells "no limit" as the largest page-aligned number it holds.
        return None if limit is None or limit >= 1 << 62 else limit

    def zygote_memory_bytes(self) -> int:
        """What the zygote cgroup holds charged now."""
        zygote = self._memory.parent / ZYGOTE
        name = "memory.current" if self.v2 else "memory.usage_in_bytes"
        return int((zygote / name).read_text())

    def add_run_process(self, pid: int) -> None:
        """Move a process into the run's cgroups, as a standby moves itself (run_procs_fds)."""
        for path in self.run_dirs:
            (path / "cgroup.procs").write_text(str(pid))

    def run_procs_fds(self) -> list[int]:
        """Descriptors of the run cgroups' `cgroup.procs`, opened for writing: a process that
        writes "0" to them moves itself into the run's limits (the kernel checks the creds of
        whoever opened them, here root). The caller closes them."""
        fds: list[int] = []
        try:
            for path in self.run_dirs:
                fds.append(os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
        except OSError:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def unreclaimable_bytes(self) -> int:
        """Memory charged here that reclaim cannot free without swap: anonymous and shared
        (tmpfs, shared memory) pages."""
        try:
            text = self._stat_file.read(_STAT_BYTES)
        except FileNotFoundError:
            return 0
        anon = _keyed_value(text, "anon" if self.v2 else "rss")
        return anon + _keyed_value(text, "shmem")

    def growth_since_baseline_bytes(self) -> int:
        """How far the unreclaimable memory is above what it was when the zygote moved in."""
        return self.unreclaimable_bytes() - self._baseline_unreclaimable

    def prepare_execution(self, memory_mb: int, max_processes: int) -> None:
        """Set this execution's limits and reset its counters."""
        # From the post-preload baseline, never from the current usage: what a run leaves
        # charged must not raise the next run's limit (the executor replaces a jail whose
        # usage stays above the baseline, see growth_since_baseline_bytes).
        usage = self._usage_bytes() if self._baseline_bytes is None else self._baseline_bytes
        limit = usage + memory_mb * MIB
        # Rewrite the limit only when it moved by more than 1 MiB: it is on the hot path.
        if abs(limit - self._limit_bytes) > MIB:
            self._write_memory_limit(limit)
        self._reset_peak()
        self.set_max_processes(max_processes)
        self._oom_kills_before = self._oom_kills()

    @property
    def max_processes(self) -> int:
        """The run's pids limit as last set (0: never set)."""
        return max(self._pids_max, 0)

    def set_max_processes(self, max_processes: int) -> None:
        """The run's pids limit alone (a session's fork makes room for its copies)."""
        if max_processes != self._pids_max:
            (self._pids / "pids.max").write_text(str(max_processes))
            self._pids_max = max_processes

    def set_cpu_limit(self, cores: float | None) -> None:
        """Limit the slot's processes together to `cores` CPUs (None: no limit).

        CFS bandwidth control: per 100 ms period the slot may run `cores` x 100 ms over all its
        threads, then waits for the next period. It covers the zygote and everything it forks,
        so a program's spinners share the slot's cores instead of taking the host's.
        """
        line = cpu_max_line(cores)
        if line == self._cpu_line:
            return
        limit_file = self._cpu / ("cpu.max" if self.v2 else "cpu.cfs_quota_us")
        if not limit_file.exists():
            raise CgroupUnavailable(
                f"no cpu controller for {self._cpu}: "
                + (
                    f"{self._cpu.parent} does not delegate +cpu (cgroup.subtree_control)"
                    if self.v2
                    else f"cgroup v1 controller 'cpu' is not mounted at {self._root}"
                )
            )
        if self.v2:
            limit_file.write_text(line)
        else:
            quota, period = line.split()
            # The period first: the quota is checked against the period in force.
            (self._cpu / "cpu.cfs_period_us").write_text(period)
            limit_file.write_text("-1" if quota == "max" else quota)
        self._cpu_line = line

    def cpu_throttling(self) -> CpuThrottling:
        """The slot's CFS bandwidth counters; zeros where there is no cpu controller."""
        try:
            text = (self._cpu / "cpu.stat").read_text()
        except FileNotFoundError:
            return CpuThrottling(0, 0, 0)
        if self.v2:
            throttled_us = _keyed_value(text, "throttled_usec")
        else:
            throttled_us = _keyed_value(text, "throttled_time") // 1000  # v1 counts ns
        return CpuThrottling(
            periods=_keyed_value(text, "nr_periods"),
            throttled_periods=_keyed_value(text, "nr_throttled"),
            throttled_us=throttled_us,
        )

    def _write_memory_limit(self, limit: int) -> None:
        if self.v2:
            (self._memory / "memory.max").write_text(str(limit))
            self._limit_bytes = limit
            return
        memsw = self._memory / "memory.memsw.limit_in_bytes"
        has_memsw = memsw.exists()
        # memsw must stay >= the memory limit: raise it first when growing, after when shrinking.
        if has_memsw and limit > self._limit_bytes:
            memsw.write_text(str(limit))
        (self._memory / "memory.limit_in_bytes").write_text(str(limit))
        if has_memsw and limit <= self._limit_bytes:
            memsw.write_text(str(limit))
        self._limit_bytes = limit

    def _reset_peak(self) -> None:
        if not self.v2:
            self._max_usage_file.write("0")
            return
        # v2 (Linux >= 6.12): a write to memory.peak resets the peak seen through that same
        # descriptor. Older kernels refuse the write; peak memory is then not reported.
        if self._peak_fd is None:
            try:
                self._peak_fd = os.open(self._memory / "memory.peak", os.O_RDWR)
            except OSError:
                self._peak_fd = -1
        if self._peak_fd >= 0:
            try:
                os.write(self._peak_fd, b"reset\n")
            except OSError:
                os.close(self._peak_fd)
                self._peak_fd = -1

    def _peak_bytes(self) -> int | None:
        if not self.v2:
            return int(self._max_usage_file.read())
        if self._peak_fd is None or self._peak_fd < 0:
            return None
        return int(os.pread(self._peak_fd, 64, 0))

    def usage(self) -> CgroupUsage:
        """Peak memory since prepare_execution, and whether the OOM killer struck."""
        peak = self._peak_bytes()
        return CgroupUsage(
            peak_memory_mb=None if peak is None else round(peak / MIB, 2),
            oom_killed=self._oom_kills() > self._oom_kills_before,
        )

    def pids(self) -> list[int]:
        """Host pids of every process in the slot's cgroups (the zygote's and the run's)."""
        found: list[int] = []
        for path in (self._pids, self._pids.parent / ZYGOTE):
            with contextlib.suppress(FileNotFoundError):
                found += [int(p) for p in (path / "cgroup.procs").read_text().split()]
        return found

    def kill_all(self) -> None:
        """SIGKILL every process in the cgroups (the zygote included)."""
        for _ in range(50):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def destroy(self) -> None:
        """Kill what is left and remove the cgroups."""
        self.kill_all()
        if self._peak_fd is not None and self._peak_fd >= 0:
            os.close(self._peak_fd)
        self._peak_fd = None
        for kernel_file in (self._usage_file, self._oom_file, self._stat_file):
            kernel_file.close()
        if not self.v2:
            self._max_usage_file.close()
        children = [*self._zygote_dirs, *self.run_dirs]
        for path in [p for p in children if p not in self.dirs.values()] + list(self.dirs.values()):
            for _ in range(20):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self.kill_all()  # EBUSY: a process was still leaving


def remove_stale(parent: str, root: Path = CGROUP_ROOT, wait_s: float = 5.0) -> list[Path]:
    """Remove the slot cgroups of workers that are gone (named ...-<pid>, pid gone): SIGKILL
    what their jails left running in them (a worker killed mid-shutdown leaves its nsjails, in
    sessions of their own), then remove the cgroups once empty, waiting up to wait_s for the
    processes to leave. Returns the cgroups that could not be removed."""
    if is_v2(root):
        bases = [root / parent]
    else:
        bases = [root / c / parent for c in V1_CONTROLLERS + V1_OPTIONAL]
    stale = [
        path
        for base in bases
        if base.is_dir()
        for path in base.iterdir()
        if path.is_dir() and _owner_gone(path.name)
    ]
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for path in stale:
            dirs = [path / child for child in (ZYGOTE, RUN) if (path / child).is_dir()] + [path]
            for directory in dirs:
                _kill_members(directory)
            with contextlib.suppress(OSError):
                for directory in dirs:
                    directory.rmdir()
            if path.exists():
                left.append(path)
        if not left or time.monotonic() >= deadline:
            return left
        stale = left
        time.sleep(0.05)


def _owner_gone(name: str) -> bool:
    owner = name.rsplit("-", 1)[-1]
    return owner.isdigit() and not Path(f"/proc/{owner}").exists()


def _kill_members(directory: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        for pid in (directory / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
