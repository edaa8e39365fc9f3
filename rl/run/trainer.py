"""`rl-sandbox train`: the whole recipe from a config file, stage after stage.

Longer than most modules because it is the one place where the parts meet: model and tokenizer,
engines and scheduler, the sandbox client (and a private service when no URL is given), the
verifier, the SFT stage, GRPO-RoC stages, metrics, checkpoints and the progress bar. Each part's
logic lives in its own module; this one only wires them and records what happened.

Outputs, in runs/<name>/: config.toml (a copy), metrics.jsonl (one line per RL step), sft.jsonl
(one line per SFT step), samples.jsonl (two rollouts per RL step), checkpoints/, tokenizer/
(tiny models), sandbox.log (private service), summary.json and metrics.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from rl.config import GRPOConfig
from rl.data.tasks import (
    Demonstration,
    Problem,
    arithmetic_demonstration,
    arithmetic_demonstrations,
    arithmetic_problems,
    load_demonstrations,
    load_problems,
)
from rl.diagnostics import answer_tag_counts, positive_tool_error_ratio
from rl.engines.base import Engine
from rl.grpo import final_rewards, policy_update, select_and_weigh
from rl.penalties import is_failed
from rl.reward.outcome import grade_responses, verifier_from_config
from rl.reward.verifier import VerifierPool
from rl.rollout.loop import HFCodec, RolloutSettings, run_rollout
from rl.rollout.scheduler import RolloutJob, RolloutScheduler
from rl.rollout.template import PromptTemplate, demonstration, rstar2_template
from rl.run.train_config import StageConfig, TrainConfig
from rl.sft import SFTExample, render_demonstrations, sft_step
from rl.trajectory import Trajectory
from trainer_client.client import SandboxClient
from trainer_client.tools import python_tool_schema

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """ "auto": the accelerator torch sees (CUDA or ROCm both answer to "cuda"), else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build_template(config: TrainConfig) -> PromptTemplate:
    """The release's template with the config's overrides."""
    base = rstar2_template([python_tool_schema()])
    overrides: dict[str, Any] = {"include_tools": config.template.include_tools}
    if config.template.system is not None:
        overrides["system"] = config.template.system
    if config.template.user_prefix is not None:
        overrides["user_prefix"] = config.template.user_prefix
    import dataclasses

    return dataclasses.replace(base, **overrides)


def load_tokenizer(path: str, auto: Any) -> Any:
    """The tokenizer saved with a model; a plain tokenizers one (our tiny model's) as it was.

    AutoTokenizer would pick the model type's tokenizer class (Qwen2's for the tiny model) and
    replace the saved pre-tokenizer with that class's, changing how numbers are split.
    """
    config = Path(path) / "tokenizer_config.json"
    if config.exists():
        saved = json.loads(config.read_text()).get("tokenizer_class")
        if saved in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(path)
    return auto.from_pretrained(path)


def _cycle(items: Sequence[Any], rng: random.Random) -> Iterator[Any]:
    while True:
        order = list(items)
        rng.shuffle(order)
        yield from order


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class Run:
    """The state of one training run, shared by its stages."""

    def __init__(self, config: TrainConfig, run_dir: Path, *, progress: bool) -> None:
        self.config = config
        self.run_dir = run_dir
        self.progress = progress
        self.device = resolve_device(config.device)
        self.amp = _DTYPES[config.amp_dtype] if config.amp_dtype else None
        self.rng = random.Random(config.seed)
        self.template = build_template(config)
        self.problems, self.sft_demos = self._task()
        self.tokenizer, self.model = self._policy()
        self.codec = HFCodec(self.tokenizer)
        end = self.tokenizer.convert_tokens_to_ids(self.template.turn_end)
        stops = {int(end)} if isinstance(end, int) and end >= 0 else set()
        if self.tokenizer.eos_token_id is not None:
            stops.add(int(self.tokenizer.eos_token_id))
        self.stop_token_ids = tuple(sorted(stops))
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.tokenizer.eos_token_id)
        self.engines = self._engines()
        self.scheduler: RolloutScheduler[Trajectory] = RolloutScheduler(self.engines)
        self.global_step = 0
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_schedule: torch.optim.lr_scheduler.LambdaLR | None = None
        self.metrics_path = run_dir / "metrics.jsonl"
        self.sft_path = run_dir / "sft.jsonl"
        self.samples_path = run_dir / "samples.jsonl"
        for path in (self.metrics_path, self.sft_path, self.samples_path):
            path.unlink(missing_ok=True)

    # --- setup --------------------------------------------------------------------------------

    def _task(self) -> tuple[list[Problem], list[Demonstration]]:
        task, seed = self.config.task, self.config.seed
        if task.kind == "jsonl":
            problems = load_problems(task.train_file)
            demos = load_demonstrations(task.sft_file) if task.sft_file else []
            return problems, demos
        shape = {"min_digits": task.min_digits, "max_digits": task.max_digits}
        problems = arithmetic_problems(task.num_problems, seed=seed, modulus=task.modulus, **shape)
        # Demonstrations on other problems (another seed): SFT teaches the format, not answers.
        sft_problems = arithmetic_problems(
            task.num_problems, seed=seed + 1, modulus=task.modulus, **shape
        )
        demos = arithmetic_demonstrations(
            sft_problems, tool_fraction=task.sft_tool_fraction, seed=seed
        )
        return problems, demos

    def _policy(self) -> tuple[Any, Any]:
        m = self.config.model
        dtype = _DTYPES[self.config.dtype]
        model: Any
        tokenizer: Any
        if m.source == "pretrained":
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tokenizer = load_tokenizer(m.path, AutoTokenizer)
            kwargs: dict[str, Any] = {"dtype": dtype}
            if m.attn_implementation:
                kwargs["attn_implementation"] = m.attn_implementation
            model = AutoModelForCausalLM.from_pretrained(m.path, **kwargs)
        else:
            from rl.run.tiny import build_model, build_tokenizer

            tokenizer = build_tokenizer(self._tokenizer_corpus(), m.vocab_size)
            tokenizer.save_pretrained(self.run_dir / "tokenizer")
            model = build_model(
                len(tokenizer),
                hidden_size=m.hidden_size,
                num_layers=m.num_layers,
                num_heads=m.num_heads,
                intermediate_size=m.intermediate_size,
                max_positions=m.max_positions,
                eos_token_id=int(tokenizer.eos_token_id),
                pad_token_id=int(tokenizer.pad_token_id),
                seed=self.config.seed,
            ).to(dtype)
        if m.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        return tokenizer, model.to(self.device)

    def _tokenizer_corpus(self) -> Iterator[str]:
        """Text like what the tiny model will read and write, to train its BPE on."""
        samples = (
            "Tool call success\nstdout: 1234567\nexecution time: 0.01s",
            "Tool call failure\nreason: \nstderr: Traceback (most recent call last):\n"
            "  File \"main.py\", line 1, in <module>\nNameError: name 'x' is not defined\n"
            "execution time: 0.02s",
            "Tool call failure\nreason: worker_timeout\nexecution time: 4.00s",
            "Failed to decode tool call: Expecting ',' delimiter: line 1 column 48 (char 47)",
        )
        for i, problem in enumerate(self.problems[:2000]):
            yield self.template.prompt(problem.question)
            if self.config.task.kind == "arithmetic":
                demo = arithmetic_demonstration(problem, use_tool=i % 2 == 0)
                responses = [samples[0].replace("1234567", problem.answer)] * (len(demo.turns) - 1)
                for text, _ in demonstration(self.template, list(demo.turns), responses):
                    yield text
        for demo in self.sft_demos[:2000] if self.config.task.kind != "arithmetic" else []:
            yield self.template.prompt(demo.question)
            yield from demo.turns
        yield from samples

    def _engines(self) -> list[Engine]:
        from rl.engines.hf import TransformersEngine

        engines: list[Engine] = []
        for i, e in enumerate(self.config.rollout.engines):
            name = e.name or f"{e.kind}{i}"
            if e.kind == "transformers":
                engines.append(
                    TransformersEngine(
                        self.model,
                        self.tokenizer,
                        name=name,
                        capacity_tokens=e.capacity_tokens,
                        max_cohorts=e.max_cohorts,
                        pad_token_id=self.pad_id,
                        seed=self.config.seed + i,
                        autocast_dtype=self.amp,
                    )
                )
            else:
                from rl.engines.vllm_colocated import VLLMEngine

                engines.append(
                    VLLMEngine.create(
                        self.config.model.path,
                        name=name,
                        capacity_tokens=e.capacity_tokens,
                        gpu_memory_utilization=e.gpu_memory_utilization,
                        tensor_parallel_size=e.tensor_parallel_size,
                        bucket_mb=e.bucket_mb,
                        seed=self.config.seed + i,
                    )
                )
        return engines

    def _amp(self) -> contextlib.AbstractContextManager[Any]:
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp)

    def settings(self, grpo: GRPOConfig) -> RolloutSettings:
        """Rollout limits of a stage."""
        r = self.config.rollout
        return RolloutSettings(
            max_turns=grpo.max_turns,
            max_response_tokens=grpo.max_response_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            tool_timeout_s=r.tool_timeout_s,
            tool_response_chars=r.tool_response_chars or None,
            stop_token_ids=self.stop_token_ids,
        )

    # --- rollouts -----------------------------------------------------------------------------

    async def rollouts(
        self,
        client: SandboxClient,
        problems: Sequence[Problem],
        n: int,
        settings: RolloutSettings,
    ) -> list[Trajectory]:
        """n rollouts of each problem, scheduled over the engines; group = problem index."""
        jobs: list[RolloutJob] = []
        for group, problem in enumerate(problems):
            prompt = self.codec.encode(self.template.prompt(problem.question))
            reserve = len(prompt) + settings.max_response_tokens
            jobs.extend(RolloutJob(prompt, reserve, group) for _ in range(n))
        self.model.eval()

        async def one(engine: Engine, job: RolloutJob) -> Trajectory:
            return await run_rollout(
                engine, client, self.codec, self.template, job.prompt_ids, settings, group=job.group
            )

        return await self.scheduler.run(
            jobs, one, used_tokens=lambda t: len(t.prompt_ids) + len(t.response_ids)
        )

    def grade(
        self, verifier: VerifierPool, trajectories: Sequence[Trajectory], truths: Sequence[str]
    ) -> list[float]:
        """The answers' 0/1 correctness (before the truncation rule)."""
        grades = grade_responses(
            [t.generated_text for t in trajectories],
            list(truths),
            fallback_to_last_boxed=self.config.grpo.fallback_to_last_boxed,
            verifier=verifier,
        )
        return [g.reward for g in grades]

    # --- stages -------------------------------------------------------------------------------

    async def sft(self, stage: StageConfig, client: SandboxClient) -> None:
        """Token-mean NLL on demonstrations, warm-up then cosine decay."""
        if not self.sft_demos:
            raise ValueError(f"stage {stage.name}: an SFT stage needs demonstrations (sft_file)")
        started = time.monotonic()
        settings = self.settings(self.config.grpo)
        examples = await render_demonstrations(
            self.sft_demos, self.template, self.codec, client, settings
        )
        lr = stage.learning_rate or self.config.grpo.learning_rate
        warmup = stage.warmup_steps if stage.warmup_steps is not None else -(-stage.steps // 25)
        optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, weight_decay=self.config.grpo.weight_decay
        )

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = (step - warmup) / max(stage.steps - warmup, 1)
            return 0.5 * (1.0 + math.cos(math.pi * progress))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        batches = _cycle(examples, self.rng)
        bar = self._bar(stage)
        for step in range(1, stage.steps + 1):
            batch: list[SFTExample] = [next(batches) for _ in range(stage.batch_size)]
            with self._amp():
                m = sft_step(
                    self.model,
                    optimizer,
                    batch,
                    pad_id=self.pad_id,
                    micro_batch_size=self.config.trainer.micro_batch_size,
                    grad_clip=self.config.grpo.grad_clip,
                )
            line = {"stage": stage.name, "step": step, "lr": schedule.get_last_lr()[0], **m}
            line["time_s"] = time.monotonic() - started
            schedule.step()
            self._append(self.sft_path, line)
            bar.set_postfix(loss=f"{m['loss']:.3f}", acc=f"{m['token_accuracy']:.3f}")
            bar.update(1)
        bar.close()

    async def filter_problems(
        self, stage: StageConfig, client: SandboxClient, verifier: VerifierPool
    ) -> list[Problem]:
        """The stage's problems less those the policy solves in every one of n samples."""
        problems = list(self.problems)
        if stage.drop_solved_samples == 0:
            return problems
        checked = problems[: stage.filter_max_problems or len(problems)]
        settings = self.settings(self.config.stage_grpo(stage))
        trajectories = await self.rollouts(client, checked, stage.drop_solved_samples, settings)
        truths = [checked[t.group].answer for t in trajectories]
        rewards = final_rewards(trajectories, self.grade(verifier, trajectories, truths))
        solved = [True] * len(checked)
        for t, r in zip(trajectories, rewards, strict=True):
            solved[t.group] = solved[t.group] and r > 0
        kept = [p for p, s in zip(checked, solved, strict=True) if not s]
        print(f"[{stage.name}] filter: {len(checked) - len(kept)} of {len(checked)} always solved")
        if not kept:
            raise RuntimeError(f"stage {stage.name}: the filter dropped every problem")
        return kept

    async def grpo(self, stage: StageConfig, client: SandboxClient, verifier: VerifierPool) -> None:
        """GRPO-RoC steps: rollouts, rewards, RoC, advantages, one update each."""
        grpo = self.config.stage_grpo(stage)
        if self.optimizer is None or stage.reset_optimizer:
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(), lr=grpo.learning_rate, weight_decay=grpo.weight_decay
            )
            warmup = grpo.warmup_steps
            self.lr_schedule = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup > 0 else 1.0
            )
        else:
            for group in self.optimizer.param_groups:
                group["initial_lr"] = grpo.learning_rate
            assert self.lr_schedule is not None
            self.lr_schedule.base_lrs = [grpo.learning_rate for _ in self.lr_schedule.base_lrs]
        assert self.lr_schedule is not None
        problems = await self.filter_problems(stage, client, verifier)
        batches = _cycle(problems, self.rng)
        settings = self.settings(grpo)
        bar = self._bar(stage)
        for stage_step in range(1, stage.steps + 1):
            self.global_step += 1
            batch = [next(batches) for _ in range(grpo.prompts_per_step)]
            line = await self._grpo_step(batch, grpo, settings, client, verifier)
            line = {"step": self.global_step, "stage": stage.name, "stage_step": stage_step, **line}
            self._append(self.metrics_path, line)
            bar.set_postfix(
                reward=f"{line['reward_mean']:.2f}", tool_err=f"{line['tool_error_ratio']:.2f}"
            )
            bar.update(1)
            every = self.config.trainer.checkpoint_every
            if every and self.global_step % every == 0:
                self.checkpoint(f"step-{self.global_step:05d}")
        bar.close()

    async def _grpo_step(
        self,
        batch: Sequence[Problem],
        grpo: GRPOConfig,
        settings: RolloutSettings,
        client: SandboxClient,
        verifier: VerifierPool,
    ) -> dict[str, Any]:
        assert self.optimizer is not None and self.lr_schedule is not None
        t0 = time.monotonic()
        trajectories = await self.rollouts(client, batch, grpo.rollouts_per_prompt, settings)
        t1 = time.monotonic()
        truths = [batch[t.group].answer for t in trajectories]
        correct = self.grade(verifier, trajectories, truths)
        rewards = final_rewards(trajectories, correct)
        selection = select_and_weigh(trajectories, rewards, grpo, self.rng)
        t2 = time.monotonic()
        lr = self.lr_schedule.get_last_lr()[0]
        update: dict[str, float] = {}
        if selection.kept:
            await self.release_engine_memory()
            with self._amp():
                update = policy_update(
                    self.model,
                    self.optimizer,
                    [trajectories[i] for i in selection.kept],
                    selection.advantages,
                    grpo,
                    pad_id=self.pad_id,
                    micro_batch_size=self.config.trainer.micro_batch_size,
                    minibatches=self.config.trainer.minibatches,
                    recompute_old_logprobs=self.config.trainer.recompute_old_logprobs,
                    temperature=self.config.rollout.temperature,
                    rng=self.rng,
                )
            self.lr_schedule.step()
            await self.sync_engines()
        t3 = time.monotonic()
        for t, r in list(zip(trajectories, rewards, strict=True))[:: grpo.rollouts_per_prompt][:2]:
            sample = {"step": self.global_step, "reward": r, "finish": t.finish_reason}
            self._append(self.samples_path, {**sample, "response": t.response_text})
        line = step_metrics(trajectories, correct, rewards)
        line.update(
            {
                "roc_groups": selection.groups,
                "roc_dropped_groups": selection.dropped_groups,
                "roc_kept": len(selection.kept),
                "roc_kept_pos": selection.kept_pos,
                "roc_kept_neg": selection.kept_neg,
                "skipped_update": not selection.kept,
                "lr": lr,
                **update,
                "time_rollout_s": t1 - t0,
                "time_reward_s": t2 - t1,
                "time_update_s": t3 - t2,
                "time_step_s": t3 - t0,
                "engines": self.scheduler.last_report.as_dict(),
            }
        )
        return line

    async def sync_engines(self) -> None:
        """Push the policy's weights to the engines with their own copy (vLLM; the transformers
        engine shares the model): after each update, after SFT, at each GRPO stage start."""
        for engine in self.engines:
            sync = getattr(engine, "sync_weights", None)
            if sync is not None:
                await sync(self.model.named_parameters())

    async def release_engine_memory(self) -> None:
        """Before an update: engines that can free their GPU memory do (vLLM's sleep mode)."""
        for engine in self.engines:
            release = getattr(engine, "release_memory", None)
            if release is not None:
                await release()

    # --- records ------------------------------------------------------------------------------

    def _bar(self, stage: StageConfig) -> Any:
        from tqdm import tqdm  # type: ignore[import-untyped]

        return tqdm(
            total=stage.steps, desc=f"{stage.name} ({stage.kind})", disable=not self.progress
        )

    @staticmethod
    def _append(path: Path, line: dict[str, Any]) -> None:
        with path.open("a") as f:
            f.write(json.dumps(line) + "\n")

    def checkpoint(self, tag: str) -> Path:
        """Model, tokenizer, optimizer and counters under checkpoints/<tag>; old ones pruned."""
        root = self.run_dir / "checkpoints"
        path = root / tag
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        if self.optimizer is not None:
            torch.save(self.optimizer.state_dict(), path / "optimizer.pt")
        (path / "state.json").write_text(json.dumps({"global_step": self.global_step}))
        keep = self.config.trainer.keep_checkpoints
        old = sorted(root.iterdir(), key=lambda p: p.stat().st_mtime)
        for stale in old[: max(len(old) - keep, 0)]:
            shutil.rmtree(stale, ignore_errors=True)
        return path


def step_metrics(
    trajectories: Sequence[Trajectory], correct: Sequence[float], rewards: Sequence[float]
) -> dict[str, Any]:
    """The rollout side of a step's metrics line."""
    calls = [r for t in trajectories for r in t.tool_results]
    lengths = [len(t.response_ids) for t in trajectories]
    groups: dict[int, bool] = {}
    for t, r in zip(trajectories, rewards, strict=True):
        groups[t.group] = groups.get(t.group, False) or r > 0
    finish: dict[str, int] = {}
    for t in trajectories:
        finish[t.finish_reason] = finish.get(t.finish_reason, 0) + 1
    return {
        "reward_mean": _mean(rewards),
        "accuracy": _mean(correct),
        "group_solve_rate": _mean([float(v) for v in groups.values()]),
        "rollouts": len(trajectories),
        "tool_error_ratio_pos": positive_tool_error_ratio(
            rewards, [t.tool_results for t in trajectories]
        ),
        "tool_error_ratio": _mean([float(is_failed(r)) for r in calls]),
        "tool_calls_per_rollout": len(calls) / max(len(trajectories), 1),
        "no_tool_frac": _mean([float(not t.tool_results) for t in trajectories]),
        "tool_latency_mean_s": _mean([r.latency_s for r in calls if r.result is not None]),
        "response_len_mean": _mean([float(n) for n in lengths]),
        "response_len_max": max(lengths, default=0),
        "generated_len_mean": _mean([float(t.num_generated) for t in trajectories]),
        "turns_mean": _mean([float(t.num_turns) for t in trajectories]),
        "truncated_frac": _mean([float(t.truncated) for t in trajectories]),
        "finish": finish,
        **answer_tag_counts([t.generated_text for t in trajectories]),
    }


def train(
    config: TrainConfig,
    *,
    run_dir: Path | None = None,
    progress: bool = True,
    config_text: str | None = None,
) -> Path:
    """Run every stage of config; returns the run directory."""
    run_dir = run_dir or Path(config.runs_dir) / config.name
    run_dir.mkdir(parents=True, exist_ok=True)
    if config_text is not None:
        (run_dir / "config.toml").write_text(config_text)
    torch.manual_seed(config.seed)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        url = config.sandbox.url
        if not url:
            from rl.run.local_service import LocalService

            service = LocalService(
                run_dir / "sandbox.log",
                workers=config.sandbox.workers,
                uid_base=config.sandbox.sandbox_uid_base,
            )
            stack.enter_context(service)
            url = service.url
        verifier = stack.enter_context(verifier_from_config(config.grpo))
        run = Run(config, run_dir, progress=progress)
        asyncio.run(_stages(run, url, verifier))
    summary = {"duration_s": time.monotonic() - started, "global_steps": run.global_step}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if config.plot and run.metrics_path.exists():
        from rl.run.plot import plot_metrics

        plot_metrics(run.metrics_path, run_dir / "metrics.png")
    return run_dir


async def _stages(run: Run, url: str, verifier: VerifierPool) -> None:
    api_key = (
        os.environ.get(run.config.sandbox.api_key_env) if run.config.sandbox.api_key_env else None
    )
    client = SandboxClient(
        url,
        api_key=api_key,
        max_batch_size=run.config.sandbox.max_batch_size,
        max_wait_s=run.config.sandbox.max_wait_s,
    )
    try:
        async with client:
            for stage in run.config.stages:
                print(f"[{stage.name}] {stage.kind}: {stage.steps} steps", flush=True)
                if stage.kind == "sft":
                    await run.sft(stage, client)
                    await run.sync_engines()  # else GRPO's first rollouts are pre-SFT
                else:
                    await run.sync_engines()  # a stage starts from the policy as it is
                    await run.grpo(stage, client, verifier)
                run.checkpoint(f"{stage.name}-end")
    finally:
        for engine in run.engines:
            close = getattr(engine, "aclose", None)
            if close is not None:
                await close()


def train_command(config_path: str, *, run_dir: str | None = None, progress: bool = True) -> int:
    """`rl-sandbox train --config FILE`: validate, train, print where the results are."""
    from rl.run.train_config import ConfigError, load_config

    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    out = train(
        config,
        run_dir=Path(run_dir) if run_dir else None,
        progress=progress,
        config_text=Path(config_path).read_text(),
    )
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    summary = json.loads((out / "summary.json").read_text())
    print(f"run directory: {out}")
    if rows:
        head = _mean([r["reward_mean"] for r in rows[: min(3, len(rows))]])
        tail = _mean([r["reward_mean"] for r in rows[-min(3, len(rows)) :]])
        print(
            f"RL steps: {len(rows)}; reward_mean first 3 steps {head:.3f}, last 3 steps "
            f"{tail:.3f}; duration {summary['duration_s']:.0f} s"
        )
    return 0
