"""Rollouts of a set of problems over the engines, and their grading: shared by the GRPO stage,
its difficulty filter and `rl-sandbox eval`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl.data.tasks import Problem
from rl.engines.base import Engine
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
) -> list[Trajectory]:
    """n rollouts of each problem, scheduled over the engines; group = problem's position."""
    jobs: list[RolloutJob] = []
    for group, problem in enumerate(problems):
        prompt = codec.encode(template.prompt(problem.question))
        reserve = len(prompt) + settings.max_response_tokens
        jobs.extend(RolloutJob(prompt, reserve, group) for _ in range(n))

    async def one(engine: Engine, job: RolloutJob) -> Trajectory:
        return await run_rollout(
            engine, tools, codec, template, job.prompt_ids, settings, group=job.group
        )

    return await scheduler.run(
        jobs, one, used_tokens=lambda t: len(t.prompt_ids) + len(t.response_ids)
    )


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


async def sync_engines(engines: Sequence[Any], model: Any) -> None:
    """Push the policy's weights to the engines with their own copy (vLLM; the transformers
    engine shares the model): after each update, after SFT, at each GRPO stage start."""
    for engine in engines:
        sync = getattr(engine, "sync_weights", None)
        if sync is not None:
            await sync(model.named_parameters())


async def release_engine_memory(engines: Sequence[Any]) -> None:
    """Before an update: engines that can free their GPU memory do (vLLM's sleep mode)."""
    for engine in engines:
        release = getattr(engine, "release_memory", None)
        if release is not None:
            await release()


def engine_rng_states(engines: Sequence[Any]) -> dict[str, Any]:
    """The sampling generators of the engines that have one (in-process), by engine name."""
    return {e.name: e.rng_state() for e in engines if hasattr(e, "rng_state")}
