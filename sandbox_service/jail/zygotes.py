"""One worker slot's warm zygotes: a lean one and the math one, chosen per program.

Every trivial call forked from the math zygote copies and tears down the page tables of numpy,
sympy and mpmath it never uses. A slot therefore keeps two warm jails: the lean one (no
preload) runs programs whose imports are all of the standard library (import_scan.py), the
math one everything else. Both are full jails of the slot (the same policy, limits, uid and
scratch; cgroups of their own), so results, seeding and isolation do not depend on the choice,
only the start-up cost does. Cold mode, and `lean_zygote=false`, keep one executor.
"""

from __future__ import annotations

from typing import Protocol

from sandbox_service.cancel import Cancel
from sandbox_service.execution import ExecutionResult, ExecutionSpec
from sandbox_service.import_scan import zygote_for
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
    """A warm slot's lean and math executors; each run goes to the one its imports pick."""

    def __init__(self, settings: Settings, slot: int) -> None:
        self.math = JailExecutor(settings, slot, mode="warm")
        try:
            self.lean = JailExecutor(settings, slot, mode="warm", lean=True)
        except BaseException:
            self.math.close()
            raise
        self.runs = {"lean": 0, "math": 0}

    def run(self, spec: ExecutionSpec, cancel: Cancel | None = None) -> ExecutionResult:
        """Run on the zygote the program's imports pick."""
        choice = zygote_for(spec.code)
        self.runs[choice] += 1
        return (self.lean if choice == "lean" else self.math).run(spec, cancel)

    @property
    def jail_starts(self) -> int:
        return self.math.jail_starts + self.lean.jail_starts

    @property
    def jail_failures(self) -> int:
        return self.math.jail_failures + self.lean.jail_failures

    @property
    def memory_recycles(self) -> int:
        return self.math.memory_recycles + self.lean.memory_recycles

    @property
    def max_runs_recycles(self) -> int:
        return self.math.max_runs_recycles + self.lean.max_runs_recycles

    def memory_above_baseline_mb(self) -> float | None:
        """The larger of the two jails' growth above their baselines."""
        grown = [e.memory_above_baseline_mb() for e in (self.math, self.lean)]
        known = [mb for mb in grown if mb is not None]
        return max(known) if known else None

    def cpu_throttling(self) -> cg.CpuThrottling:
        """Both executors' CFS counters summed."""
        a, b = self.math.cpu_throttling(), self.lean.cpu_throttling()
        return cg.CpuThrottling(
            periods=a.periods + b.periods,
            throttled_periods=a.throttled_periods + b.throttled_periods,
            throttled_us=a.throttled_us + b.throttled_us,
        )

    def close(self) -> None:
        """Tear both down."""
        try:
            self.lean.close()
        finally:
            self.math.close()


def slot_executor(settings: Settings, slot: int) -> SlotExecutor:
    """The executor of worker slot `slot`: two zygotes chosen per program in warm mode with
    `lean_zygote`, else one."""
    if settings.executor_mode == "warm" and settings.lean_zygote:
        return ChosenZygotes(settings, slot)
    return JailExecutor(settings, slot)
