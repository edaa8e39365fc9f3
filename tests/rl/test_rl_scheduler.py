"""The load-balanced scheduler: admission by free capacity, never over it, every rollout runs.

The engines here are scripted (they only count): what is under test is who gets which rollout
when, which does not depend on what an engine generates.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from rl.engines.base import Engine, Generation, SamplingParams
from rl.rollout.scheduler import RolloutJob, RolloutScheduler


@dataclass
class CountingEngine:
    """Knows its capacity; records the reservations that are live on it at any moment."""

    name: str
    capacity_tokens: int
    live_tokens: int = 0
    peak_tokens: int = 0
    ran: list[int] = field(default_factory=list)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        raise AssertionError("not used: the test's rollout function does the work")


def jobs(n: int, reserve: int | Sequence[int]) -> list[RolloutJob]:
    sizes = [reserve] * n if isinstance(reserve, int) else list(reserve)
    return [RolloutJob([i], size, group=i // 4) for i, size in enumerate(sizes)]


def rollout_fn(steps: dict[int, int]):  # type: ignore[no-untyped-def]
    async def rollout(engine: Engine, job: RolloutJob) -> tuple[int, str]:
        assert isinstance(engine, CountingEngine)
        engine.live_tokens += job.reserve_tokens
        engine.peak_tokens = max(engine.peak_tokens, engine.live_tokens)
        assert engine.live_tokens <= engine.capacity_tokens, "over-admitted"
        engine.ran.append(job.prompt_ids[0])
        for _ in range(steps[job.prompt_ids[0]]):
            await asyncio.sleep(0)
        engine.live_tokens -= job.reserve_tokens
        return job.prompt_ids[0], engine.name

    return rollout


async def test_engines_of_different_capacities_never_overflow_and_all_rollouts_finish() -> None:
    big, small = CountingEngine("big", 1000), CountingEngine("small", 300)
    rng = random.Random(7)
    work = jobs(60, [rng.choice([100, 150, 200]) for _ in range(60)])
    steps = {job.prompt_ids[0]: rng.randrange(1, 40) for job in work}
    scheduler: RolloutScheduler[tuple[int, str]] = RolloutScheduler([big, small])
    results = await scheduler.run(work, rollout_fn(steps), used_tokens=lambda r: 50)
    assert [index for index, _ in results] == list(range(60))  # every one, in job order
    assert big.peak_tokens <= 1000 and small.peak_tokens <= 300
    assert sorted(big.ran + small.ran) == list(range(60))
    # Capacity is handed out again as it frees: each engine ran more than it can hold at once.
    assert len(big.ran) > 1000 // 100 and len(small.ran) > 300 // 100
    # The big engine takes the larger share.
    assert len(big.ran) > len(small.ran)
    report = scheduler.last_report.as_dict()
    assert report["big"]["rollouts"] == len(big.ran)
    assert 0 < report["big"]["peak_reserved_frac"] <= 1.0
    assert 0 < report["small"]["mean_reserved_frac"] <= report["small"]["peak_reserved_frac"]
    assert 0 < report["big"]["used_of_reserved"] < 1


async def test_a_rollout_goes_to_the_engine_with_most_free_room() -> None:
    a, b = CountingEngine("a", 400), CountingEngine("b", 400)
    release = asyncio.Event()

    async def rollout(engine: Engine, job: RolloutJob) -> str:
        if job.prompt_ids[0] == 0:
            await release.wait()  # the first rollout holds its room until the end
        else:
            release.set()
        return engine.name

    scheduler: RolloutScheduler[str] = RolloutScheduler([a, b])
    placed = await scheduler.run(jobs(3, [300, 300, 100]), rollout)
    # 0 -> a; 1 does not fit beside it, goes to b; 2 goes where 100 tokens are free.
    assert placed[:2] == ["a", "b"]


async def test_rollouts_wait_rather_than_overfill_a_single_engine() -> None:
    only = CountingEngine("only", 250)
    steps = dict.fromkeys(range(10), 5)
    scheduler: RolloutScheduler[tuple[int, str]] = RolloutScheduler([only])
    await scheduler.run(jobs(10, 100), rollout_fn(steps))
    assert only.peak_tokens == 200  # two at a time, never three
    assert scheduler.last_report.as_dict()["only"]["peak_concurrent"] == 2


async def test_a_rollout_that_fits_no_engine_is_refused_before_anything_runs() -> None:
    engine = CountingEngine("e", 100)
    scheduler: RolloutScheduler[tuple[int, str]] = RolloutScheduler([engine])
    with pytest.raises(ValueError, match="fits no engine"):
        await scheduler.run(jobs(2, [50, 101]), rollout_fn({0: 1, 1: 1}))
    assert engine.ran == []


async def test_a_failed_rollout_cancels_the_others_and_is_raised() -> None:
    engine = CountingEngine("e", 1000)
    cancelled = 0

    async def rollout(e: Engine, job: RolloutJob) -> int:
        nonlocal cancelled
        if job.prompt_ids[0] == 3:
            raise RuntimeError("engine died")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled += 1
            raise
        return 0

    scheduler: RolloutScheduler[int] = RolloutScheduler([engine])
    with pytest.raises(RuntimeError, match="engine died"):
        await scheduler.run(jobs(6, 100), rollout)
    assert cancelled == 5


def test_engine_names_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        RolloutScheduler([CountingEngine("x", 1), CountingEngine("x", 2)])
