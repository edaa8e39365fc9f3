"""Rollouts of a set of problems over the engines, and their grading: shared by the GRPO stage,
its difficulty filter and `rl-sandbox eval`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import torch

from rl.data.tasks import Problem
from rl.engines.base import Engine
from rl.parallel.distributed import gather_objects, gathered, world
from rl.reward.grading import Grader
from rl.reward.outcome import grade_responses
from rl.reward.verifier import VerifierPool
from rl.rollout.loop import Codec, RolloutSettings, run_rollout
from rl.rollout.scheduler import RolloutJob, RolloutScheduler
from rl.rollout.template import PromptTemplate
from rl.trajectory import Trajectory
from trainer_client.tools import Executes


async def collect_rollouts(
    scheduler: RolloutScheduler[Trajectory],
    tools: Executes,
    codec: Codec,
    template: PromptTemplate,
    problems: Sequence[Problem],
    n: int,
    settings: RolloutSettings,
    *,
    on_finished: Callable[[int, Trajectory], None] | None = None,
) -> list[Trajectory]:
    """n rollouts of each problem, scheduled over the engines; group = problem's position.

    on_finished(job index, trajectory) is called as each rollout ends, the others still running.
    """
    jobs: list[RolloutJob] = []
    for group, problem in enumerate(problems):
        prompt = codec.encode(template.prompt(problem.question))
        reserve = len(prompt) + settings.max_response_tokens
        jobs.extend(RolloutJob(prompt, reserve, group) for _ in range(n))

    index = {id(job): i for i, job in enumerate(jobs)}

    async def one(engine: Engine, job: RolloutJob) -> Trajectory:
        trajectory = await run_rollout(
            engine, tools, codec, template, job.prompt_ids, settings, group=job.group
        )
        if on_finished is not None:
            on_finished(index[id(job)], trajectory)
        return trajectory

    return await scheduler.run(
        jobs, one, used_tokens=lambda t: len(t.prompt_ids) + len(t.response_ids)
    )


def rank_share(groups: int, rank: int, world_size: int) -> list[int]:
    """The groups (problems) a rank rolls out: every world_size-th from its rank, so each
    rank gets a share of the step's prompts (equal up to one)."""
    return list(range(rank, groups, world_size))


async def rollouts_over_ranks(
    policy: torch.nn.Module,
    scheduler: RolloutScheduler[Trajectory],
    tools: Executes,
    codec: Codec,
    template: PromptTemplate,
    problems: Sequence[Problem],
    n: int,
    settings: RolloutSettings,
    grader: Grader,
    *,
    gather_policy: bool = True,
) -> tuple[list[Trajectory], list[float]]:
    """n graded rollouts of each problem, group = problem's position, in group order.

    Under torchrun each rank rolls out and grades its share of the problems (rank_share) with
    its own engines, on the whole policy gathered from the shards, then the ranks exchange
    them: every rank returns the same whole batch. One process: all of them, as it is.
    A per-rollout grader (the service's) grades each rollout as it ends, while the others run.
    gather_policy: False when no engine samples from the policy (samples_from_policy): the
    shards then stay as they are.
    """
    rank, size = world()
    share = rank_share(len(problems), rank, size)
    with gathered(policy) if gather_policy else contextlib.nullcontext():
        mine, correct = await collect_graded(
            scheduler, tools, codec, template, [problems[i] for i in share], n, settings, grader
        )
    mine = [dataclasses.replace(t, group=share[t.group]) for t in mine]
    pairs = [
        pair for part in gather_objects(list(zip(mine, correct, strict=True))) for pair in part
    ]
    pairs.sort(key=lambda pair: pair[0].group)  # stable: a group's rollouts keep their order
    return [t for t, _ in pairs], [c for _, c in pairs]


async def collect_graded(
    scheduler: RolloutScheduler[Trajectory],
    tools: Executes,
    codec: Codec,
    template: PromptTemplate,
    problems: Sequence[Problem],
    n: int,
    settings: RolloutSettings,
    grader: Grader,
) -> tuple[list[Trajectory], list[float]]:
    """collect_rollouts and the answers' 0/1 correctness (before the truncation rule)."""
    if not grader.per_rollout:
        trajectories = await collect_rollouts(
            scheduler, tools, codec, template, problems, n, settings
        )
        truths = [problems[t.group].answer for t in trajectories]
        return trajectories, await grader.rewards([t.generated_text for t in trajectories], truths)
    grading: dict[int, asyncio.Future[float]] = {}

    def start_grading(index: int, trajectory: Trajectory) -> None:
        reward: Awaitable[float] = grader.reward(
            trajectory.generated_text, problems[trajectory.group].answer
        )
        grading[index] = asyncio.ensure_future(reward)

    try:
        trajectories = await collect_rollouts(
            scheduler, tools, codec, template, problems, n, settings, on_finished=start_grading
        )
        correct = list(await asyncio.gather(*(grading[i] for i in range(len(trajectories)))))
    finally:
        for future in grading.values():
            future.cancel()
        await asyncio.gather(*grading.values(), return_exceptions=True)
    return trajectories, correct


def grade(
    verifier: VerifierPool,
    trajectories: Sequence[Trajectory],
    truths: Sequence[str],
    *,
    fallback_to_last_boxed: bool,
) -> list[float]:
    """The answers' 0/1 correctness (before the truncation rule)."""
    grades = grade_responses(
        [t.generated_text for t in trajectories],
        list(truths),
        fallback_to_last_boxed=fallback_to_last_boxed,
        verifier=verifier,
    )
    return [g.reward for g in grades]


def samples_from_policy(engines: Sequence[Any]) -> bool:
    """Whether an engine samples from the trained module itself (the transformers engine shares
    it): only then must the policy be gathered whole for rollouts. vLLM and remote engines hold
    their own copies."""
    from rl.engines.hf import TransformersEngine

    return any(isinstance(e, TransformersEngine) for e in engines)


async def sync_engines(engines: Sequence[Any], model: Any) -> int:
    """Push the policy's weights to the engines with their own copy (vLLM; the transformers
    engine shares the model); returns how many were pushed to."""
    pushed = 0
    for engine in engines:
        sync = getattr(engine, "sync_weights", None)
        if sync is not None:
            await sync(model.named_parameters())
            pushed += 1
    return pushed


async def release_engine_memory(engines: Sequence[Any]) -> None:
    """Before an update: engines that can free their GPU memory do (vLLM's sleep mode)."""
    for engine in engines:
        release = getattr(engine, "release_memory", None)
        if release is not None:
            await release()


def engine_rng_states(engines: Sequence[Any]) -> dict[str, Any]:
    """The sampling generators of the engines that have one (in-process), by engine name."""
    return {e.name: e.rng_state() for e in engines if hasattr(e, "rng_state")}
