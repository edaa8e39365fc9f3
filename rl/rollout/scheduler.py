"""Load-balanced rollout scheduler: rollouts go to engines by free KV-cache capacity (paper §3.2).

A static split (N rollouts per engine up front) makes every engine wait for its longest rollout
and, when an engine's KV cache overflows, evicts half its rollouts to recompute them later. Here
each rollout reserves its maximum length (prompt + response budget, in tokens) on one engine for
its whole life, so an engine can never run out of cache mid-rollout:

    while rollouts wait:
        engine = the one with the most free tokens (capacity - reserved)
        if the next rollout's reservation fits there: admit it, else wait for one to finish
    a finished rollout releases its reservation; the next rollout is admitted at once

Admission is first in, first out (no starvation); no engine is ever over its capacity, so
nothing is evicted or recomputed. Per engine it reports rollouts run, peak and time-averaged
reservation, and how much of the reserved room the rollouts actually used.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from rl.engines.base import Engine


@dataclass(frozen=True, slots=True)
class RolloutJob:
    """One rollout to run: its prompt, its group, and the tokens it may grow to."""

    prompt_ids: list[int]
    reserve_tokens: int
    """Prompt + response budget: the most KV cache it can ever hold."""
    group: int = 0
    """Index of its prompt in the step."""


@dataclass(slots=True)
class EngineUsage:
    """How one engine was used during a run."""

    name: str
    capacity_tokens: int
    rollouts: int = 0
    reserved_tokens: int = 0
    """Reserved right now."""
    peak_reserved_tokens: int = 0
    peak_concurrent: int = 0
    running: int = 0
    used_tokens: int = 0
    """Final lengths (prompt + response) of its finished rollouts, summed."""
    released_tokens: int = 0
    """Reservations of its finished rollouts, summed."""
    reserved_token_s: float = 0.0
    """Integral of the reservation over time."""

    def as_dict(self, elapsed_s: float) -> dict[str, float]:
        """Utilisation figures for logs: fractions of capacity and of reservations."""
        mean = self.reserved_token_s / elapsed_s if elapsed_s > 0 else 0.0
        return {
            "rollouts": float(self.rollouts),
            "capacity_tokens": float(self.capacity_tokens),
            "peak_reserved_frac": self.peak_reserved_tokens / self.capacity_tokens,
            "mean_reserved_frac": mean / self.capacity_tokens,
            "peak_concurrent": float(self.peak_concurrent),
            "used_of_reserved": self.used_tokens / self.released_tokens
            if self.released_tokens
            else 0.0,
        }


@dataclass(slots=True)
class SchedulerReport:
    """Per-engine usage of one run."""

    engines: list[EngineUsage] = field(default_factory=list)
    elapsed_s: float = 0.0

    def as_dict(self) -> dict[str, dict[str, float]]:
        """{engine name: utilisation figures}."""
        return {u.name: u.as_dict(self.elapsed_s) for u in self.engines}


class RolloutScheduler[T]:
    """Runs rollouts on several engines, admitting each only where its maximum length fits."""

    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("need at least one engine")
        names = [e.name for e in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique, got {names}")
        self._engines = list(engines)
        self.last_report = SchedulerReport()

    @property
    def engines(self) -> list[Engine]:
        """The engines, in order."""
        return list(self._engines)

    async def run(
        self,
        jobs: Sequence[RolloutJob],
        rollout: Callable[[Engine, RolloutJob], Awaitable[T]],
        *,
        used_tokens: Callable[[T], int] | None = None,
    ) -> list[T]:
        """Run every job, each on one engine; results in job order. A failure cancels the rest.

        used_tokens: the final length of a result, for the used-of-reserved figure.
        """
        largest = max(e.capacity_tokens for e in self._engines)
        for job in jobs:
            if job.reserve_tokens < 1 or job.reserve_tokens > largest:
                raise ValueError(
                    f"a rollout reserving {job.reserve_tokens} tokens fits no engine "
                    f"(largest capacity {largest}); lower the response budget or add capacity"
                )
        usage = {e.name: EngineUsage(e.name, e.capacity_tokens) for e in self._engines}
        report = SchedulerReport(list(usage.values()))
        self.last_report = report
        started = last_change = time.monotonic()

        def account() -> None:
            nonlocal last_change
            now = time.monotonic()
            for u in usage.values():
                u.reserved_token_s += u.reserved_tokens * (now - last_change)
            last_change = now

        results: dict[int, T] = {}
        waiting = deque(range(len(jobs)))
        running: dict[asyncio.Task[T], tuple[int, Engine]] = {}
        try:
            while waiting or running:
                while waiting:
                    position = waiting[0]
                    job = jobs[position]
                    engine = self._pick(job, usage)
                    if engine is None:
                        break
                    waiting.popleft()
                    account()
                    u = usage[engine.name]
                    u.reserved_tokens += job.reserve_tokens
                    if u.reserved_tokens > u.capacity_tokens:
                        raise AssertionError(f"over-admitted {engine.name}")  # by construction
                    u.running += 1
                    u.rollouts += 1
                    u.peak_reserved_tokens = max(u.peak_reserved_tokens, u.reserved_tokens)
                    u.peak_concurrent = max(u.peak_concurrent, u.running)
                    task = asyncio.ensure_future(rollout(engine, job))
                    running[task] = (position, engine)
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                account()
                for task in done:
                    position, engine = running.pop(task)
                    job = jobs[position]
                    u = usage[engine.name]
                    u.reserved_tokens -= job.reserve_tokens
                    u.running -= 1
                    result = task.result()  # raises the rollout's exception
                    results[position] = result
                    u.released_tokens += job.reserve_tokens
                    if used_tokens is not None:
                        u.used_tokens += used_tokens(result)
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            account()
            report.elapsed_s = time.monotonic() - started
        return [results[i] for i in range(len(jobs))]

    def _pick(self, job: RolloutJob, usage: dict[str, EngineUsage]) -> Engine | None:
        best: Engine | None = None
        best_free = -1
        for engine in self._engines:
            u = usage[engine.name]
            free = u.capacity_tokens - u.reserved_tokens
            if free >= job.reserve_tokens and free > best_free:
                best, best_free = engine, free
        return best
