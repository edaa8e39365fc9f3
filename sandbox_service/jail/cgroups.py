"""The cgroups of one executor slot: memory and process limits for each execution.

The zygote is moved into the slot's cgroup after it has preloaded, so its preloaded pages stay
charged where they were (charges do not move with a process) and each execution's limit covers
what that execution allocates: the program, its children, its tmpfs files. The OOM killer of the
cgroup picks the program, never the zygote: children raise their oom_score_adj to 1000.

Both hierarchies are supported, found at start-up: cgroup v1 (one tree per controller, the
memory and pids controllers) and cgroup v2 (one tree; `<parent>` must have +memory +pids in its
cgroup.subtree_control, which deploy/worker-entrypoint.sh sets up in containers).
Units: the kernel's files take bytes; this module's API takes MiB.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids")
MIB = 1024 * 1024


class CgroupUnavailable(RuntimeError):
    """The host lacks the memory and pids controllers, or we may not write them."""


@dataclass(frozen=True, slots=True)
class CgroupUsage:
    """Counters of one execution."""

    peak_memory_mb: float | None
    oom_killed: bool


def _keyed_value(text: str, key: str) -> int:
    """The value of `key` in a flat keyed file such as memory.events or memory.oom_control."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


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

    def read(self) -> str:
        return os.pread(self._descriptor(), 4096, 0).decode()

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

    whole_life (sessions): the memory limit covers everything since the zygote moved in, so a
    session cannot grow cell after cell; otherwise it covers one execution.
    """

    def __init__(
        self, parent: str, name: str, whole_life: bool = False, root: Path = CGROUP_ROOT
    ) -> None:
        self.v2 = is_v2(root)
        if self.v2:
            self.dirs = {"unified": root / parent / name}
            self._memory = self._pids = self.dirs["unified"]
        else:
            self.dirs = {c: root / c / parent / name for c in V1_CONTROLLERS}
            self._memory, self._pids = self.dirs["memory"], self.dirs["pids"]
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
        self._baseline_bytes: int | None = None
        self._limit_bytes = -1
        self._pids_max = -1
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
            delegation = self._memory.parent / "cgroup.subtree_control"
            enabled = delegation.read_text().split() if delegation.exists() else []
            if not {"memory", "pids"} <= set(enabled):
                raise CgroupUnavailable(
                    f"cgroup v2: {self._memory.parent} must delegate +memory +pids "
                    "(cgroup.subtree_control); deploy/worker-entrypoint.sh shows how"
                )
        else:
            for controller in V1_CONTROLLERS:
                if not (self._root / controller).is_dir():
                    raise CgroupUnavailable(
                        f"cgroup v1 controller {controller!r} is not mounted at {self._root}"
                    )
        for path in self.dirs.values():
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CgroupUnavailable(
                    f"cannot create {path}: {exc} (workers must run as root)"
                ) from exc
        if self.v2:
            with contextlib.suppress(OSError):
                (self._memory / "memory.swap.max").write_text("0")
            self._limit_bytes = -1
        else:
            self._limit_bytes = int((self._memory / "memory.limit_in_bytes").read_text())
            with contextlib.suppress(OSError):
                (self._memory / "memory.swappiness").write_text("0")

    def add_process(self, pid: int) -> None:
        """Move a process (all its threads) into the slot's cgroups."""
        for path in self.dirs.values():
            (path / "cgroup.procs").write_text(str(pid))
        self._baseline_bytes = self._usage_bytes()

    def prepare_execution(self, memory_mb: int, max_processes: int) -> None:
        """Set this execution's limits and reset its counters."""
        if self._whole_life and self._baseline_bytes is not None:
            usage = self._baseline_bytes
        else:
            usage = self._usage_bytes()
        limit = usage + memory_mb * MIB
        # Rewrite the limit only when it moved by more than 1 MiB: it is on the hot path.
        if abs(limit - self._limit_bytes) > MIB:
            self._write_memory_limit(limit)
        self._reset_peak()
        if max_processes != self._pids_max:
            # +1: the zygote itself lives in the cgroup.
            (self._pids / "pids.max").write_text(str(max_processes + 1))
            self._pids_max = max_processes
        self._oom_kills_before = self._oom_kills()

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
        """Host pids of every process in the slot's cgroups."""
        with contextlib.suppress(FileNotFoundError):
            return [int(p) for p in (self._pids / "cgroup.procs").read_text().split()]
        return []

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
        for kernel_file in (self._usage_file, self._oom_file):
            kernel_file.close()
        if not self.v2:
            self._max_usage_file.close()
        for path in self.dirs.values():
            for _ in range(20):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    self.kill_all()  # EBUSY: a process was still leaving


def remove_stale(parent: str, root: Path = CGROUP_ROOT) -> None:
    """Remove empty slot cgroups left by workers that died (named ...-<pid>, pid gone)."""
    bases = [root / parent] if is_v2(root) else [root / c / parent for c in V1_CONTROLLERS]
    for base in bases:
        if not base.is_dir():
            continue
        for path in base.iterdir():
            owner = path.name.rsplit("-", 1)[-1]
            if path.is_dir() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
                with contextlib.suppress(OSError):
                    path.rmdir()
