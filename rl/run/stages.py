"""The stage kinds of the recipe, as functions over the run's context.

`sft_stage`: token-mean NLL on demonstrations. `filter_problems`: the stage-3 difficulty filter
(drop what the policy always solves). `grpo_stage`: GRPO-RoC steps, each `grpo_step`: rollouts,
rewards, Resample-on-Correct, advantages, one update, metrics.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from rl.config import GRPOConfig
from rl.data.order import DrawOrder
from rl.data.tasks import Problem
from rl.diagnostics import step_metrics
from rl.grpo import final_rewards, policy_update, select_and_weigh
from rl.parallel.distributed import barrier
from rl.rollout.demonstrations import render_demonstrations
from rl.rollout.loop import RolloutSettings
from rl.run.checkpoint import (
    full_model_state,
    full_optimizer_state,
    prune,
    save_checkpoint,
    save_rank_rng,
    step_tag,
)
from rl.run.collect import (
    engine_rng_states,
    release_engine_memory,
    rollouts_over_ranks,
    samples_from_policy,
    sync_engines,
)
from rl.run.context import RunContext
from rl.run.optim import grpo_optimizer, retarget, sft_optimizer
from rl.run.train_config import StageConfig
from rl.sft import sft_step


async def sync_policy(ctx: RunContext) -> None:
    """Push the policy to the engines with their own weights (vLLM) if it changed since they
    last got it: after SFT, at a GRPO stage's start, after each update, never twice in a row."""
    if ctx.synced_version == ctx.policy_version:
        return
    await sync_engines(ctx.engines, ctx.model)
    ctx.synced_version = ctx.policy_version


def checkpoint(ctx: RunContext, tag: str) -> None:
    """Save the run's state under checkpoints/<tag>; prune the stale periodic ones.

    Under torchrun every rank calls it: the whole model and optimizer state are gathered to
    rank 0, which writes them; each rank writes its own random states.
    """
    root = ctx.run_dir / "checkpoints"
    model_state = full_model_state(ctx.policy)
    optimizer_state = full_optimizer_state(ctx.policy, ctx.optimizer) if ctx.optimizer else None
    rank = ctx.topology.rank
    save_rank_rng(root / tag, rank, engine_rng_states(ctx.engines))
    barrier()  # every rank's random states are on disk before state.json marks it complete
    if ctx.topology.is_main:
        save_checkpoint(
            root / tag,
            model=ctx.model,
            model_state=model_state,
            tokenizer=ctx.tokenizer,
            progress=ctx.progress,
            rng=ctx.rng,
            optimizer_state=optimizer_state,
            schedule=ctx.schedule,
            warmup_steps=ctx.warmup_steps,
        )
        prune(root, ctx.config.trainer.keep_checkpoints)
    barrier()


async def sft_stage(ctx: RunContext, stage: StageConfig) -> None:
    """Token-mean NLL on demonstrations, warm-up then the stage's rate schedule (run whole: no
    mid-stage checkpoint)."""
    if not ctx.demos:
        raise ValueError(f"stage {stage.name}: an SFT stage needs demonstrations (sft_file)")
    started = time.monotonic()
    grpo = ctx.config.grpo
    await release_engine_memory(ctx.engines)  # vLLM sleeps: SFT has the GPU; the sync wakes it
    examples = await render_demonstrations(
        ctx.demos, ctx.template, ctx.codec, ctx.tools, ctx.rollout_settings(grpo)
    )
    warmup = stage.warmup_steps if stage.warmup_steps is not None else -(-stage.steps // 25)
    optimizer, schedule = sft_optimizer(
        ctx.policy,
        lr=stage.learning_rate or grpo.learning_rate,
        weight_decay=grpo.weight_decay,
        warmup=warmup,
        total=stage.steps,
        schedule=stage.lr_schedule,
        decay_steps=stage.decay_steps,
    )
    order = DrawOrder(len(examples), ctx.config.seed, stage.name)
    bar = ctx.records.bar(stage.steps, f"{stage.name} ({stage.kind})")
    for step in range(1, stage.steps + 1):
        batch = [examples[i] for i in order.take(stage.batch_size)]
        with ctx.autocast():
            m = sft_step(
                ctx.policy,
                optimizer,
                batch,
                pad_id=ctx.pad_id,
                micro_batch_size=ctx.config.trainer.micro_batch_size,
                micro_batch_tokens=ctx.config.trainer.micro_batch_tokens,
                grad_clip=grpo.grad_clip,
            )
        line = {"stage": stage.name, "step": step, "lr": schedule.get_last_lr()[0], **m}
        line["time_s"] = time.monotonic() - started
        schedule.step()
        ctx.records.sft_step(line)
        ctx.progress.stage_step = step
        ctx.policy_version += 1
        bar.set_postfix(loss=f"{m['loss']:.3f}", acc=f"{m['token_accuracy']:.3f}")
        bar.update(1)
    bar.close()


def problems_to_check(n: int, cap: int, rng: random.Random) -> list[int]:
    """Which of n problems the filter samples: all, or `cap` of them drawn at random."""
    if not cap or cap >= n:
        return list(range(n))
    return sorted(rng.sample(range(n), cap))


def after_filter(n: int, checked: Sequence[int], solved: Sequence[bool]) -> list[int]:
    """The problems a stage trains on: every one but the checked ones always solved."""
    dropped = {i for i, s in zip(checked, solved, strict=True) if s}
    return [i for i in range(n) if i not in dropped]


async def filter_problems(ctx: RunContext, stage: StageConfig) -> list[int]:
    """Indices of the stage's problems less those the policy solves in every one of n samples."""
    n = len(ctx.problems)
    if stage.drop_solved_samples == 0:
        return list(range(n))
    rng = random.Random(f"{ctx.config.seed}:{stage.name}:filter")
    checked = problems_to_check(n, stage.filter_max_problems, rng)
    grpo = ctx.config.stage_grpo(stage)
    trajectories, correct = await rollouts_over_ranks(
        ctx.policy,
        ctx.scheduler,
        ctx.tools,
        ctx.codec,
        ctx.template,
        [ctx.problems[i] for i in checked],
        stage.drop_solved_samples,
        ctx.rollout_settings(grpo),
        ctx.grader(grpo),
        gather_policy=samples_from_policy(ctx.engines),
    )
    rewards = final_rewards(trajectories, correct)
    solved = [True] * len(checked)
    for t, r in zip(trajectories, rewards, strict=True):
        solved[t.group] = solved[t.group] and r > 0
    kept = after_filter(n, checked, solved)
    if ctx.topology.is_main:
        print(f"[{stage.name}] filter: {n - len(kept)} of {len(checked)} checked always solved")
    if not kept:
        raise RuntimeError(f"stage {stage.name}: the filter dropped every problem")
    return kept


def start_grpo_optimizer(ctx: RunContext, grpo: GRPOConfig, stage: StageConfig) -> None:
    """A fresh optimizer at the first GRPO stage (or on reset_optimizer), else a new base rate."""
    if ctx.optimizer is None or ctx.schedule is None or stage.reset_optimizer:
        ctx.optimizer, ctx.schedule = grpo_optimizer(
            ctx.policy,
            lr=grpo.learning_rate,
            weight_decay=grpo.weight_decay,
            warmup=grpo.warmup_steps,
        )
        ctx.warmup_steps = grpo.warmup_steps
    else:
        retarget(ctx.optimizer, ctx.schedule, grpo.learning_rate)


async def grpo_stage(ctx: RunContext, stage: StageConfig, *, resumed: bool) -> None:
    """GRPO-RoC steps from where the stage stands (step 0, or a resumed checkpoint's)."""
    grpo = ctx.config.stage_grpo(stage)
    progress = ctx.progress
    if not resumed:
        start_grpo_optimizer(ctx, grpo, stage)
        progress.problems = await filter_problems(ctx, stage)
        progress.order = {}
    assert progress.problems is not None
    problems = [ctx.problems[i] for i in progress.problems]
    order = DrawOrder(len(problems), ctx.config.seed, stage.name, **progress.order)
    settings = ctx.rollout_settings(grpo)
    bar = ctx.records.bar(stage.steps, f"{stage.name} ({stage.kind})", progress.stage_step)
    every = ctx.config.trainer.checkpoint_every
    while progress.stage_step < stage.steps:
        batch = [problems[i] for i in order.take(grpo.prompts_per_step)]
        progress.global_step += 1
        progress.stage_step += 1
        progress.order = order.position()
        line = await grpo_step(ctx, batch, grpo, settings)
        head = {
            "step": progress.global_step,
            "stage": stage.name,
            "stage_step": progress.stage_step,
        }
        ctx.records.rl_step({**head, **line})
        bar.set_postfix(
            reward=f"{line['reward_mean']:.2f}", tool_err=f"{line['tool_error_ratio']:.2f}"
        )
        bar.update(1)
        if every and progress.global_step % every == 0:
            checkpoint(ctx, step_tag(progress.global_step))
    bar.close()


async def grpo_step(
    ctx: RunContext, batch: Sequence[Problem], grpo: GRPOConfig, settings: RolloutSettings
) -> dict[str, Any]:
    """One RL step on a batch of problems; its metrics line (without the step counters)."""
    assert ctx.optimizer is not None and ctx.schedule is not None
    t0 = time.monotonic()
    ctx.policy.eval()
    trajectories, correct = await rollouts_over_ranks(
        ctx.policy,
        ctx.scheduler,
        ctx.tools,
        ctx.codec,
        ctx.template,
        batch,
        grpo.rollouts_per_prompt,
        settings,
        ctx.grader(grpo),
        gather_policy=samples_from_policy(ctx.engines),
    )
    t1 = time.monotonic()
    rewards = final_rewards(trajectories, correct)
    selection = select_and_weigh(trajectories, rewards, grpo, ctx.rng)
    t2 = time.monotonic()
    lr = ctx.schedule.get_last_lr()[0]
    update: dict[str, float] = {}
    if selection.kept:
        await release_engine_memory(ctx.engines)
        with ctx.autocast():
            update = policy_update(
                ctx.policy,
                ctx.optimizer,
                [trajectories[i] for i in selection.kept],
                selection.advantages,
                grpo,
                pad_id=ctx.pad_id,
                batching=ctx.batching(),
                minibatches=ctx.config.trainer.minibatches,
                recompute_old_logprobs=ctx.config.trainer.recompute_old_logprobs,
                temperature=ctx.config.rollout.temperature,
                rng=ctx.rng,
            )
        ctx.schedule.step()
        ctx.policy_version += 1
        await sync_policy(ctx)
    t3 = time.monotonic()
    step = ctx.progress.global_step
    # A Prometheus-style line, so that log scrapers can follow masked rollouts per step.
    print(f'rl_infra_masked_rollouts{{step="{step}"}} {selection.infra_masked}', flush=True)
    for t, r in list(zip(trajectories, rewards, strict=True))[:: grpo.rollouts_per_prompt][:2]:
        sample = {"step": step, "reward": r, "finish": t.finish_reason}
        ctx.records.sample({**sample, "response": t.response_text})
    line = step_metrics(trajectories, correct, rewards)
    line.update(
        {
            "roc_groups": selection.groups,
            "roc_dropped_groups": selection.dropped_groups,
            "roc_kept": len(selection.kept),
            "roc_kept_pos": selection.kept_pos,
            "roc_kept_neg": selection.kept_neg,
            "infra_masked": selection.infra_masked,
            "skipped_update": not selection.kept,
            "lr": lr,
            **update,
            "time_rollout_s": t1 - t0,
            "time_reward_s": t2 - t1,
            "time_update_s": t3 - t2,
            "time_step_s": t3 - t0,
            "engines": ctx.scheduler.last_report.as_dict(),
        }
    )
    return line
