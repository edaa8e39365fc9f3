"""One worker slot's warm zygotes: lean, math and data ones, chosen per program.

Every call forked from a zygote copies and tears down the page tables of all it preloaded:
a trivial call forked from the data zygote pays for numpy, sympy, mpmath and pandas it never
uses, a sympy call for pandas' 350 mappings. A slot therefore keeps up to three warm jails: the
lean one (the standard library's common modules) runs programs whose imports are all of the
standard library, the math one (numpy, sympy, mpmath) those that add only those, the data one
(pandas too) everything else (import_scan.py). All are full jails of the slot (the same policy,
limits, uid and scratch; cgroups of their own), so results, seeding and isolation do not depend
on the choice, only the start-up cost does. Cold mode, and `lean_zygote=false`, keep the data
one alone; `math_zygote=false` keeps lean and data.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from sandbox_service.cancel import Cancel
from sandbox_service.execution import ExecutionResult, ExecutionSpec
from sandbox_service.import_scan import Zygote, zygote_for
from sandbox_service.jail import cgroups as cg
from sandbox_service.jail.executor import JailExecutor
from sandbox_service.settings import Settings


class SlotExecutor(Protocol):
    """What a worker needs of its slot's executor (JailExecutor or ChosenZygotes)."""

    @property
    def jail_starts(self) -> int: ...
    @property
    def jail_failures(self) -> int: ...
    @property
    def memory_recycles(self) -> int: ...
    @property
    def max_runs_recycles(self) -> int: ...

    def run(self, spec: ExecutionSpec, cancel: Cancel | None = None) -> ExecutionResult: ...
    def memory_above_baseline_mb(self) -> float | None: ...
    def cpu_throttling(self) -> cg.CpuThrottling: ...
    def close(self) -> None: ...


class ChosenZygotes:
    """A warm slot's zygotes' executors; each run goes to the one its imports pick."""

    def __init__(self, settings: Settings, slot: int) -> None:
        kept: tuple[Zygote, ...] = ("data", "lean", "math")
        if not settings.math_zygote:
            kept = ("data", "lean")
        self.executors: dict[Zygote, JailExecutor] = {}
        try:
            for zygote in kept:
                self.executors[zygote] = JailExecutor(settings, slot, mode="warm", zygote=zygote)
        except BaseException:
            self.close()
            raise
        self.runs: dict[Zygote, int] = {"lean": 0, "math": 0, "data": 0}
        """Runs per zygote the scan picked (a math pick runs on the data zygote when the slot
        keeps no math one)."""

    def run(self, spec: ExecutionSpec, cancel: Cancel | None = None) -> ExecutionResult:
        """Run on the zygote the program's imports pick."""
        choice = zygote_for(spec.code)
        self.runs[choice] += 1
        return self.executors.get(choice, self.executors["data"]).run(spec, cancel)

    @property
    def jail_starts(self) -> int:
        return sum(e.jail_starts for e in self.executors.values())

    @property
    def jail_failures(self) -> int:
        return sum(e.jail_failures for e in self.executors.values())

    @property
    def memory_recycles(self) -> int:
        return sum(e.memory_recycles for e in self.executors.values())

    @property
    def max_runs_recycles(self) -> int:
        return sum(e.max_runs_recycles for e in self.executors.values())

    def memory_above_baseline_mb(self) -> float | None:
        """The largest of the jails' growth above their baselines."""
        grown = [e.memory_above_baseline_mb() for e in self.executors.values()]
        known = [mb for mb in grown if mb is not None]
        return max(known) if known else None

    def cpu_throttling(self) -> cg.CpuThrottling:
        """The executors' CFS counters summed."""
        counters = [e.cpu_throttling() for e in self.executors.values()]
        return cg.CpuThrottling(
            periods=sum(c.periods for c in counters),
            throttled_periods=sum(c.throttled_periods for c in counters),
            throttled_us=sum(c.throttled_us for c in counters),
        )

    def close(self) -> None:
        """Tear them all down (each even if another's close fails)."""
        with contextlib.ExitStack() as closing:
            for executor in self.executors.values():
                closing.callback(executor.close)


def slot_executor(settings: Settings, slot: int) -> SlotExecutor:
    """The executor of worker slot `slot`: zygotes chosen per program in warm mode with
    `lean_zygote`, else one."""
    if settings.executor_mode == "warm" and settings.lean_zygote:
        return ChosenZygotes(settings, slot)
    return JailExecutor(settings, slot)
