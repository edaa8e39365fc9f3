"""The cgroups (v1) of one executor slot: memory and process limits for each execution.

The zygote is moved into the slot's cgroups after it has preloaded, so its preloaded pages stay
charged where they were (memory.move_charge_at_immigrate is 0) and each execution's limit covers
what that execution allocates: the program, its children, its tmpfs files. The OOM killer of the
cgroup picks the program, never the zygote: children raise their oom_score_adj to 1000.
Units: the kernel's files take bytes; this module's API takes MiB.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")
MIB = 1024 * 1024


class CgroupUnavailable(RuntimeError):
    """The host lacks the cgroup v1 memory and pids controllers, or we may not write them."""


@dataclass(frozen=True, slots=True)
class CgroupUsage:
    """Counters of one execution."""

    peak_memory_mb: float
    oom_killed: bool


def _read_oom_kills(memory_dir: Path) -> int:
    for line in (memory_dir / "memory.oom_control").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


class SlotCgroups:
    """memory + pids cgroups owned by one executor slot of one worker process."""

    def __init__(self, parent: str, name: str, whole_life: bool = False) -> None:
        self.dirs = {c: CGROUP_ROOT / c / parent / name for c in CONTROLLERS}
        # whole_life (sessions): the memory limit covers everything since the zygote moved in,
        # so a session cannot grow cell after cell; otherwise it covers one execution.
        self._whole_life = whole_life
        self._baseline_bytes: int | None = None
        self._memory = self.dirs["memory"]
        self._oom_kills_before = 0
        self._limit_bytes = -1
        self._pids_max = -1

    def create(self) -> None:
        """Create the cgroups (idempotent); CgroupUnavailable with the reason if we cannot."""
        for controller, path in self.dirs.items():
            if not (CGROUP_ROOT / controller).is_dir():
                raise CgroupUnavailable(
                    f"cgroup v1 controller {controller!r} is not mounted at {CGROUP_ROOT}; "
                    "rl-sandbox needs the memory and pids controllers (cgroup v1)"
                )
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CgroupUnavailable(
                    f"cannot create {path}: {exc} (run workers as root)"
                ) from exc
        self._limit_bytes = int((self._memory / "memory.limit_in_bytes").read_text())
        with contextlib.suppress(OSError):
            (self._memory / "memory.swappiness").write_text("0")
        with contextlib.suppress(OSError):
            (self._memory / "memory.move_charge_at_immigrate").write_text("0")

    def add_process(self, pid: int) -> None:
        """Move a process (all its threads) into the slot's cgroups."""
        for path in self.dirs.values():
            (path / "cgroup.procs").write_text(str(pid))
        self._baseline_bytes = int((self._memory / "memory.usage_in_bytes").read_text())

    def prepare_execution(self, memory_mb: int, max_processes: int) -> None:
        """Set this execution's limits and reset its counters."""
        if self._whole_life and self._baseline_bytes is not None:
            usage = self._baseline_bytes
        else:
            usage = int((self._memory / "memory.usage_in_bytes").read_text())
        limit = usage + memory_mb * MIB
        # Rewrite the limit only when it moved by more than 1 MiB: it is on the hot path.
        if abs(limit - self._limit_bytes) > MIB:
            self._write_memory_limit(limit)
        (self._memory / "memory.max_usage_in_bytes").write_text("0")
        if max_processes != self._pids_max:
            # +1: the zygote itself lives in the cgroup.
            (self.dirs["pids"] / "pids.max").write_text(str(max_processes + 1))
            self._pids_max = max_processes
        self._oom_kills_before = _read_oom_kills(self._memory)

    def _write_memory_limit(self, limit: int) -> None:
        memsw = self._memory / "memory.memsw.limit_in_bytes"
        has_memsw = memsw.exists()
        # memsw must stay >= the memory limit: raise it first when growing, after when shrinking.
        if has_memsw and limit > self._limit_bytes:
            memsw.write_text(str(limit))
        (self._memory / "memory.limit_in_bytes").write_text(str(limit))
        if has_memsw and limit <= self._limit_bytes:
            memsw.write_text(str(limit))
        self._limit_bytes = limit

    def usage(self) -> CgroupUsage:
        """Peak memory since prepare_execution, and whether the OOM killer struck."""
        peak = int((self._memory / "memory.max_usage_in_bytes").read_text())
        return CgroupUsage(
            peak_memory_mb=round(peak / MIB, 2),
            oom_killed=_read_oom_kills(self._memory) > self._oom_kills_before,
        )

    def pids(self) -> list[int]:
        """Host pids of every process in the slot's cgroups."""
        with contextlib.suppress(FileNotFoundError):
            text = (self.dirs["pids"] / "cgroup.procs").read_text()
            return [int(p) for p in text.split()]
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
        for path in self.dirs.values():
            with contextlib.suppress(OSError):
                path.rmdir()


def remove_stale(parent: str) -> None:
    """Remove empty slot cgroups left by workers that died (named ...-<pid>, pid gone)."""
    for controller in CONTROLLERS:
        base = CGROUP_ROOT / controller / parent
        if not base.is_dir():
            continue
        for path in base.iterdir():
            owner = path.name.rsplit("-", 1)[-1]
            if path.is_dir() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
                with contextlib.suppress(OSError):
                    path.rmdir()
