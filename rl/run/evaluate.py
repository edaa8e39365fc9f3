"""`rl-sandbox eval`: pass@1 of a policy, averaged over k samples per problem (paper §4: k = 16
at temperature 0.6, for AIME24/25), with the training rollout loop and its Python tool.

pass@1 of a problem is the share of its k samples whose final answer is right (a truncated one
counts as wrong, as in training); the reported pass@1 is its mean over the problems. Writes
results.jsonl (one line per problem: its samples' correctness, turns, tool calls and one
response) and summary.json to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rl.config import GRPOConfig
from rl.data.datasets import Columns, load_problem_file
from rl.data.tasks import Problem
from rl.grpo import final_rewards
from rl.reward.outcome import verifier_from_config
from rl.reward.verifier import VerifierPool
from rl.rollout.loop import HFCodec, RolloutSettings
from rl.rollout.scheduler import RolloutScheduler
from rl.run import build
from rl.run.collect import collect_rollouts, grade
from rl.run.train_config import TrainConfig
from rl.trajectory import Trajectory
from trainer_client.client import SandboxClient


@dataclasses.dataclass(frozen=True, slots=True)
class EvalSettings:
    """What one evaluation runs."""

    samples: int = 16
    """k: samples per problem (paper: 16)."""
    temperature: float = 0.6
    """Sampling temperature (paper: 0.6)."""
    limit: int = 0
    """Evaluate the first N problems only (0: all)."""

    def __post_init__(self) -> None:
        if self.samples < 1 or self.temperature < 0 or self.limit < 0:
            raise ValueError("need samples >= 1, temperature >= 0, limit >= 0")


def pass_at_1(correct: Sequence[Sequence[float]]) -> float:
    """Mean over problems of the share of correct samples (unbiased pass@1 from k samples)."""
    if not correct or any(not c for c in correct):
        raise ValueError("need at least one problem, each with at least one sample")
    return sum(sum(c) / len(c) for c in correct) / len(correct)


def problem_results(
    problems: Sequence[Problem], trajectories: Sequence[Trajectory], rewards: Sequence[float]
) -> list[dict[str, Any]]:
    """One result line per problem from its samples (trajectory.group = problem index)."""
    by_problem: list[list[tuple[Trajectory, float]]] = [[] for _ in problems]
    for t, r in zip(trajectories, rewards, strict=True):
        by_problem[t.group].append((t, r))
    lines = []
    for index, (problem, samples) in enumerate(zip(problems, by_problem, strict=True)):
        correct = [r for _, r in samples]
        lines.append(
            {
                "index": index,
                "question": problem.question,
                "answer": problem.answer,
                "pass@1": sum(correct) / len(correct),
                "correct": correct,
                "turns_mean": sum(t.num_turns for t, _ in samples) / len(samples),
                "tool_calls_mean": sum(len(t.tool_results) for t, _ in samples) / len(samples),
                "truncated": sum(t.truncated for t, _ in samples),
                "response": samples[0][0].response_text,
            }
        )
    return lines


def _stage_grpo(config: TrainConfig) -> GRPOConfig:
    """The limits of the config's last GRPO stage (the policy's final budget)."""
    grpo_stages = [s for s in config.stages if s.kind == "grpo"]
    return config.stage_grpo(grpo_stages[-1]) if grpo_stages else config.grpo


def _problems(config: TrainConfig, path: str | None) -> list[Problem]:
    if path is None:
        return build.load_task(config)[0]
    task = config.task
    file_format = "parquet" if path.endswith(".parquet") else "jsonl"
    columns = Columns(question=task.question_field, answer=task.answer_field)
    problems, _ = load_problem_file(
        path, file_format, columns, integer_answers_only=task.integer_answers_only
    )
    return problems


async def _evaluate(
    config: TrainConfig,
    checkpoint: str | None,
    problems: list[Problem],
    settings: EvalSettings,
    url: str,
    verifier: VerifierPool,
) -> tuple[list[Trajectory], list[float]]:
    template = build.build_template(config)
    if checkpoint is None and config.model.source != "pretrained":
        raise ValueError("a tiny model must be evaluated from a checkpoint (--checkpoint)")
    tokenizer, model = build.build_policy(
        config,
        Path(checkpoint or config.model.path),
        iter(()),
        checkpoint=Path(checkpoint) if checkpoint else None,
    )
    model.eval()
    pad_id = build.pad_token_id(tokenizer)
    amp = build.DTYPES[config.amp_dtype] if config.amp_dtype else None
    engines = build.build_engines(
        config, model, tokenizer, pad_id=pad_id, amp=amp, model_path=checkpoint or config.model.path
    )
    grpo = _stage_grpo(config)
    rollout = RolloutSettings(
        max_turns=grpo.max_turns,
        max_response_tokens=grpo.max_response_tokens,
        temperature=settings.temperature,
        top_p=config.rollout.top_p,
        tool_timeout_s=config.rollout.tool_timeout_s,
        tool_response_chars=config.rollout.tool_response_chars or None,
        stop_token_ids=build.stop_token_ids(tokenizer, template),
    )
    env = config.sandbox.api_key_env
    client = SandboxClient(url, api_key=os.environ.get(env) if env else None)
    scheduler: RolloutScheduler[Trajectory] = RolloutScheduler(engines)
    try:
        async with client:
            trajectories = await collect_rollouts(
                scheduler, client, HFCodec(tokenizer), template, problems, settings.samples, rollout
            )
    finally:
        for engine in engines:
            close = getattr(engine, "aclose", None)
            if close is not None:
                await close()
    truths = [problems[t.group].answer for t in trajectories]
    correct = grade(
        verifier, trajectories, truths, fallback_to_last_boxed=grpo.fallback_to_last_boxed
    )
    return trajectories, final_rewards(trajectories, correct)


def evaluate(
    config: TrainConfig,
    out: Path,
    settings: EvalSettings,
    *,
    checkpoint: str | None = None,
    problems_path: str | None = None,
) -> dict[str, Any]:
    """Run the evaluation, write results.jsonl and summary.json under out; return the summary."""
    if config.grpo.answer_kind != "math":
        raise ValueError('rl-sandbox eval grades math answers only (grpo.answer_kind = "math")')
    started = time.monotonic()
    problems = _problems(config, problems_path)
    if settings.limit:
        problems = problems[: settings.limit]
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        url = config.sandbox.url
        if not url:
            from rl.run.local_service import LocalService

            service = LocalService(
                out / "sandbox.log",
                workers=config.sandbox.workers,
                uid_base=config.sandbox.sandbox_uid_base,
            )
            url = stack.enter_context(service).url
        verifier = stack.enter_context(verifier_from_config(config.grpo))
        trajectories, rewards = asyncio.run(
            _evaluate(config, checkpoint, problems, settings, url, verifier)
        )
    lines = problem_results(problems, trajectories, rewards)
    (out / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = {
        "pass@1": pass_at_1([x["correct"] for x in lines]),
        "problems": len(lines),
        "samples_per_problem": settings.samples,
        "temperature": settings.temperature,
        "checkpoint": checkpoint,
        "truncated_frac": sum(t.truncated for t in trajectories) / len(trajectories),
        "tool_calls_per_rollout": sum(len(t.tool_results) for t in trajectories)
        / len(trajectories),
        "duration_s": time.monotonic() - started,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def eval_command(args: argparse.Namespace) -> int:
    """`rl-sandbox eval --config FILE --checkpoint DIR --out DIR`."""
    from rl.run.train_config import ConfigError, load_config

    try:
        config = load_config(args.config)
        settings = EvalSettings(
            samples=args.samples, temperature=args.temperature, limit=args.limit
        )
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}")
        return 2
    summary = evaluate(
        config,
        Path(args.out),
        settings,
        checkpoint=args.checkpoint,
        problems_path=args.problems,
    )
    print(
        f"pass@1 {summary['pass@1']:.3f} over {summary['problems']} problems x "
        f"{summary['samples_per_problem']} samples (T = {summary['temperature']}); "
        f"results in {args.out}"
    )
    return 0
