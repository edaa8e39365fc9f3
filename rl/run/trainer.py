"""`rl-sandbox train`: the whole recipe from a config file, stage after stage; `--resume`.

The one place where the parts meet: it builds the run's context (rl.run.build), opens the
sandbox client (and a private service when no URL is given), the verifier and the metric sinks,
then runs each stage (rl.run.stages) and checkpoints at its end. A resumed run rebuilds the same
context from its latest checkpoint and goes on from the step after it.

Under torchrun (`torchrun --nproc-per-node N -m rl.cli train --config FILE`, or N nodes) the
same code runs on every rank: the policy is FSDP2-sharded over the ranks, each rank rolls out
and grades its share of each step's prompts with its own engines and the ranks exchange the
graded rollouts, every rank takes the same update over a share of the rows (rl.grpo), and
rank 0 writes logs and checkpoints (the other ranks log to rank<r>/). Rank 0 starts the
private service when no URL is given (one node only: set sandbox.url across nodes).

Outputs, in runs/<name>/: config.toml (a copy), metrics.jsonl (one line per RL step), sft.jsonl
(one line per SFT step), samples.jsonl (two rollouts per RL step), checkpoints/, tokenizer/
(tiny models), sandbox.log (private service), tensorboard/ and wandb/ (when enabled),
summary.json and metrics.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from rl.parallel.distributed import (
    Topology,
    all_reduce,
    barrier,
    broadcast_object,
    init_from_env,
)
from rl.reward.outcome import verifier_from_config
from rl.reward.verifier import VerifierPool
from rl.rollout.loop import HFCodec
from rl.rollout.scheduler import RolloutScheduler
from rl.run import build
from rl.run.checkpoint import (
    Progress,
    Saved,
    latest_checkpoint,
    load_checkpoint,
    load_optimizer_state,
)
from rl.run.context import RunContext
from rl.run.optim import grpo_optimizer
from rl.run.records import Recorder, Sink, TensorBoardSink, WandbSink
from rl.run.stages import checkpoint, grpo_stage, sft_stage, sync_policy
from rl.run.train_config import TrainConfig
from rl.trajectory import Trajectory
from trainer_client.client import SandboxClient


def _sinks(config: TrainConfig, run_dir: Path) -> list[Sink]:
    sinks: list[Sink] = []
    if config.logging.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    if config.logging.wandb:
        project = config.logging.wandb_project
        sinks.append(
            WandbSink(
                run_dir,
                project=project,
                name=config.name,
                config={"name": config.name, "seed": config.seed},
            )
        )
    return sinks


def build_context(
    config: TrainConfig,
    run_dir: Path,
    tools: SandboxClient,
    verifier: VerifierPool | None,
    records: Recorder,
    saved: Saved | None,
    topology: Topology | None = None,
) -> RunContext:
    """Every part of a run, new or (saved given) as its checkpoint left it; this rank's."""
    topology = topology or init_from_env(timeout_s=config.trainer.collective_timeout_s)
    template = build.build_template(config)
    problems, demos = build.load_task(config)
    corpus = build.tokenizer_corpus(config, template, problems, demos)
    device = topology.device if topology.world_size > 1 else build.resolve_device(config.device)
    tokenizer, model = build.build_policy(
        config,
        run_dir,
        corpus,
        checkpoint=saved.path if saved else None,
        device=device,
        save_tokenizer=topology.is_main,
    )
    _check_same_vocabulary(tokenizer)
    policy = build.build_trained(config, model, device, topology.world_size)
    problems = build.cap_prompt_length(problems, template, tokenizer, config.task.max_prompt_tokens)
    pad_id = build.pad_token_id(tokenizer)
    amp = build.DTYPES[config.amp_dtype] if config.amp_dtype else None
    model_path = str(saved.path) if saved else config.model.path
    engines = build.build_engines(
        config,
        model,
        tokenizer,
        pad_id=pad_id,
        amp=amp,
        model_path=model_path,
        rank=topology.rank,
        local_rank=topology.local_rank,
        world_size=topology.world_size,
    )
    scheduler: RolloutScheduler[Trajectory] = RolloutScheduler(engines)
    ctx = RunContext(
        config=config,
        run_dir=run_dir,
        template=template,
        tokenizer=tokenizer,
        model=model,
        policy=policy,
        topology=topology,
        codec=HFCodec(tokenizer),
        pad_id=pad_id,
        stop_token_ids=build.stop_token_ids(tokenizer, template),
        amp=amp,
        problems=problems,
        demos=demos,
        engines=engines,
        scheduler=scheduler,
        tools=tools,
        verifier=verifier,
        verify_client=tools if verifier is None else None,
        records=records,
        rng=random.Random(config.seed),
        progress=Progress(),
    )
    if saved is not None:
        restore(ctx, saved)
    return ctx


def _check_same_vocabulary(tokenizer: Any) -> None:
    """Ranks exchange rollouts as token ids: their tokenizers must agree (a tiny model's is
    trained on each rank from the same text)."""
    vocab = sorted(tokenizer.get_vocab().items())
    digest = float(int.from_bytes(hashlib.sha256(repr(vocab).encode()).digest()[:6], "big"))
    if all_reduce(digest, "max") != digest:
        raise RuntimeError("the ranks built different tokenizers")


def restore(ctx: RunContext, saved: Saved) -> None:
    """Counters, random states and the GRPO optimizer from a checkpoint (model already loaded)."""
    ctx.progress = saved.progress
    ctx.rng.setstate(saved.python_rng)
    torch.set_rng_state(saved.torch_rng)
    for engine in ctx.engines:
        state = saved.engine_rng.get(engine.name)
        set_state = getattr(engine, "set_rng_state", None)
        if state is not None and set_state is not None:
            set_state(state)
    if saved.optimizer is not None:
        # lr and weight decay come back with the state dict; the warm-up with the schedule.
        ctx.warmup_steps = int(saved.optimizer["warmup_steps"])
        ctx.optimizer, ctx.schedule = grpo_optimizer(
            ctx.policy, lr=1.0, weight_decay=0.0, warmup=ctx.warmup_steps
        )
        load_optimizer_state(ctx.policy, ctx.optimizer, saved.optimizer["optimizer"])
        ctx.schedule.load_state_dict(saved.optimizer["schedule"])


async def run_stages(ctx: RunContext) -> None:
    """Each stage from where the run stands, a checkpoint at each stage's end."""
    stages = ctx.config.stages
    first = ctx.progress.stage_index
    for index in range(first, len(stages)):
        stage = stages[index]
        resumed = index == first and ctx.progress.stage_step > 0
        if resumed and ctx.progress.stage_step >= stage.steps:
            continue  # the checkpoint was this stage's end
        if not resumed:
            ctx.progress.stage_index, ctx.progress.stage_step = index, 0
        if ctx.topology.is_main:
            print(f"[{stage.name}] {stage.kind}: {stage.steps} steps", flush=True)
        if stage.kind == "sft":
            await sft_stage(ctx, stage)
            await sync_policy(ctx)  # else GRPO's first rollouts are pre-SFT
        else:
            await sync_policy(ctx)  # a stage starts from the policy as it is
            await grpo_stage(ctx, stage, resumed=resumed)
        checkpoint(ctx, f"{stage.name}-end")


def train(
    config: TrainConfig,
    *,
    run_dir: Path | None = None,
    progress: bool = True,
    config_text: str | None = None,
    resume: bool = False,
) -> Path:
    """Run every stage of config (or, resume, the rest of them); returns the run directory.

    Under torchrun every rank calls it (rank 0 writes the run's files)."""
    topology = init_from_env(timeout_s=config.trainer.collective_timeout_s)
    run_dir = run_dir or Path(config.runs_dir) / config.name
    main = topology.is_main
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if config_text is not None:
            (run_dir / "config.toml").write_text(config_text)
    barrier()
    saved = None
    if resume:
        found = latest_checkpoint(run_dir / "checkpoints")
        if found is None:
            raise FileNotFoundError(f"{run_dir}: no complete checkpoint to resume from")
        saved = load_checkpoint(found, topology.rank)
        if main:
            step = saved.progress.global_step
            print(f"resuming from {found.name} (RL step {step})", flush=True)
    torch.manual_seed(config.seed)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        url = config.sandbox.url
        if not url and main:
            from rl.run.local_service import LocalService

            service = LocalService(
                run_dir / "sandbox.log",
                workers=config.sandbox.workers,
                uid_base=config.sandbox.sandbox_uid_base,
            )
            stack.enter_context(service)
            url = service.url
        url = broadcast_object(url)
        stack.callback(barrier)  # rank 0's service outlives every rank's last call
        verifier = None
        if config.reward.resolved(has_service=True) == "local":
            verifier = stack.enter_context(verifier_from_config(config.grpo))
        log_dir = run_dir if main else run_dir / f"rank{topology.rank}"
        log_dir.mkdir(parents=True, exist_ok=True)
        sinks = _sinks(config, run_dir) if main else []
        records = stack.enter_context(Recorder(log_dir, sinks, progress=progress and main))
        if saved is None:
            records.start_fresh()
        else:
            records.keep_only(*_kept_lines(config, saved.progress))
        global_steps = asyncio.run(_run(config, run_dir, url, verifier, records, saved, topology))
    if not main:
        return run_dir
    summary = {"duration_s": time.monotonic() - started, "global_steps": global_steps}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if config.plot and records.metrics_path.exists():
        from rl.run.plot import plot_metrics

        plot_metrics(records.metrics_path, run_dir / "metrics.png")
    return run_dir


def _kept_lines(config: TrainConfig, at: Progress) -> tuple[Any, Any]:
    """Which lines a resume keeps: those written up to its checkpoint."""
    index = {s.name: i for i, s in enumerate(config.stages)}

    def keep_rl(line: dict[str, Any]) -> bool:
        return int(line["step"]) <= at.global_step

    def keep_sft(line: dict[str, Any]) -> bool:
        i = index.get(line["stage"], len(index))
        return i < at.stage_index or (i == at.stage_index and int(line["step"]) <= at.stage_step)

    return keep_rl, keep_sft


async def _run(
    config: TrainConfig,
    run_dir: Path,
    url: str,
    verifier: VerifierPool | None,
    records: Recorder,
    saved: Saved | None,
    topology: Topology,
) -> int:
    env = config.sandbox.api_key_env
    client = SandboxClient(
        url,
        api_key=os.environ.get(env) if env else None,
        max_batch_size=config.sandbox.max_batch_size,
        max_wait_s=config.sandbox.max_wait_s,
    )
    ctx = build_context(config, run_dir, client, verifier, records, saved, topology)
    try:
        async with client:
            await run_stages(ctx)
    finally:
        for engine in ctx.engines:
            close = getattr(engine, "aclose", None)
            if close is not None:
                await close()
    return ctx.progress.global_step


def train_command(
    config_path: str | None,
    *,
    run_dir: str | None = None,
    progress: bool = True,
    resume: str | None = None,
) -> int:
    """`rl-sandbox train --config FILE` or `--resume RUN`: validate, train, say where it went."""
    from rl.run.train_config import ConfigError, load_config

    if resume is not None:
        out_dir: Path | None = Path(resume)
        config_path = str(Path(resume) / "config.toml")
    else:
        out_dir = Path(run_dir) if run_dir else None
    if config_path is None:
        print("error: give --config FILE or --resume RUN")
        return 2
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"error: {exc}")
        return 2
    try:
        out = train(
            config,
            run_dir=out_dir,
            progress=progress,
            config_text=None if resume else Path(config_path).read_text(),
            resume=resume is not None,
        )
    except FileNotFoundError as exc:
        print(f"error: {exc}")
        return 2
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    print("\n".join(run_summary_lines(out)))
    return 0


def run_summary_lines(out: Path) -> list[str]:
    """What `rl-sandbox train` prints at the end: the run directory and, when the run had RL
    steps, the reward of the first 3 steps and of the last fifth (a run of SFT stages alone
    writes no metrics.jsonl)."""
    metrics = out / "metrics.jsonl"
    text = metrics.read_text() if metrics.exists() else ""
    rows = [json.loads(x) for x in text.splitlines() if x.strip()]
    summary = json.loads((out / "summary.json").read_text())
    lines = [f"run directory: {out}"]
    if rows:
        rewards = [r["reward_mean"] for r in rows]
        k = max(len(rewards) // 5, 1)
        lines.append(
            f"RL steps: {len(rows)}; reward_mean first 3 steps {_mean(rewards[:3]):.3f}, "
            f"last fifth ({k} steps) {_mean(rewards[-k:]):.3f}; "
            f"duration {summary['duration_s']:.0f} s"
        )
    else:
        lines.append(f"no RL steps; duration {summary['duration_s']:.0f} s")
    return lines


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
