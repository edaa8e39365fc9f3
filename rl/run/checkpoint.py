"""Checkpoints: what a run needs to go on exactly where it stopped, and which ones to keep.

checkpoints/<tag>/ holds the model and tokenizer (transformers' save_pretrained), optimizer.pt
(the GRPO optimizer's whole state keyed by parameter name, and its schedule, when one exists),
rng.pt (torch's generator and each engine's sampling generator; rng-rank<r>.pt for the other
ranks under torchrun) and state.json (the counters: global step, stage, step inside it,
the stage's problems after its filter, where its draw order stands, Resample-on-Correct's
random state). Under torchrun the model and optimizer states are gathered whole to rank 0 and
written in the one-process layout, so a run resumes on any number of ranks (rank r > 0 gets
its own sampling generators back only when the checkpoint has rng-rank<r>.pt).

Tags are `step-NNNNN` (every `checkpoint_every` RL steps; only the newest
`keep_checkpoints` are kept) and `<stage>-end` (never pruned: each stage's result).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

_STEP_TAG = re.compile(r"step-(\d+)")


@dataclass(slots=True)
class Progress:
    """Where a run stands: the counters a checkpoint stores and a resume restores."""

    global_step: int = 0
    """RL steps done over all stages."""
    stage_index: int = 0
    """The stage running (or about to)."""
    stage_step: int = 0
    """Steps of that stage done."""
    problems: list[int] | None = None
    """The GRPO stage's problems (indices into the task) after its filter; None: not yet."""
    order: dict[str, int] = field(default_factory=dict)
    """The stage's draw order position (rl.data.order.DrawOrder.position)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "global_step": self.global_step,
            "stage_index": self.stage_index,
            "stage_step": self.stage_step,
            "problems": self.problems,
            "order": self.order,
        }


def step_tag(global_step: int) -> str:
    """The tag of a periodic checkpoint."""
    return f"step-{global_step:05d}"


def stale_checkpoints(tags: Sequence[str], keep: int) -> list[str]:
    """The periodic (step-N) tags past the newest `keep`; stage-end tags are never stale."""
    steps = sorted((int(m.group(1)), t) for t in tags if (m := _STEP_TAG.fullmatch(t)))
    return [t for _, t in steps[: max(len(steps) - keep, 0)]]


def full_model_state(policy: torch.nn.Module) -> dict[str, Any]:
    """The policy's whole weights on rank 0's CPU, by the LM's parameter names ({} elsewhere).
    A collective under FSDP: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(policy, options=options)
    prefix = "lm."  # the LogProbModel around the LM
    return {k.removeprefix(prefix): v for k, v in state.items()}


def full_optimizer_state(policy: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Any:
    """The optimizer's whole state on rank 0's CPU, keyed by parameter name (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(policy, optimizer, options=options)


def load_optimizer_state(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, state: Any
) -> None:
    """A whole optimizer state (full_optimizer_state's) into this rank's optimizer (its shard)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(
        policy, optimizer, state, options=StateDictOptions(full_state_dict=True)
    )


def rng_file(rank: int) -> str:
    """The random-state file of a rank."""
    return "rng.pt" if rank == 0 else f"rng-rank{rank}.pt"


def save_rank_rng(path: Path, rank: int, engine_rng: dict[str, torch.Tensor]) -> None:
    """This rank's torch generator and engines' sampling generators."""
    path.mkdir(parents=True, exist_ok=True)
    torch.save({"torch": torch.get_rng_state(), "engines": engine_rng}, path / rng_file(rank))


def save_checkpoint(
    path: Path,
    *,
    model: Any,
    model_state: dict[str, Any],
    tokenizer: Any,
    progress: Progress,
    rng: random.Random,
    optimizer_state: Any,
    schedule: torch.optim.lr_scheduler.LRScheduler | None,
    warmup_steps: int,
) -> None:
    """Write the model (model_state, in model's layout), tokenizer, optimizer and counters
    under path, state.json last (rank 0, after every rank's save_rank_rng)."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, state_dict=model_state)
    tokenizer.save_pretrained(path)
    if optimizer_state is not None and schedule is not None:
        torch.save(
            {
                "optimizer": optimizer_state,
                "schedule": schedule.state_dict(),
                "warmup_steps": warmup_steps,
            },
            path / "optimizer.pt",
        )
    state = {**progress.as_dict(), "python_rng": _rng_to_json(rng.getstate())}
    # state.json last: a checkpoint without it was cut short and is not resumed from.
    (path / "state.json").write_text(json.dumps(state))


def prune(root: Path, keep: int) -> None:
    """Delete the stale periodic checkpoints under root."""
    tags = [p.name for p in root.iterdir() if p.is_dir()] if root.exists() else []
    for tag in stale_checkpoints(tags, keep):
        shutil.rmtree(root / tag, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class Saved:
    """A checkpoint read back."""

    path: Path
    progress: Progress
    python_rng: tuple[Any, ...]
    torch_rng: torch.Tensor
    engine_rng: dict[str, torch.Tensor]
    optimizer: dict[str, Any] | None
    """{"optimizer", "schedule" (state dicts), "warmup_steps"}, when a GRPO optimizer was saved."""


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint furthest into the run (by stage, then step), if any."""
    best: tuple[tuple[int, int, int], Path] | None = None
    for path in root.iterdir() if root.exists() else []:
        state_file = path / "state.json"
        if not state_file.exists():
            continue
        s = json.loads(state_file.read_text())
        key = (s["stage_index"], s["stage_step"], s["global_step"])
        if best is None or key > best[0]:
            best = (key, path)
    return best[1] if best else None


def load_checkpoint(path: Path, rank: int = 0) -> Saved:
    """Read a checkpoint's counters and states, with rank's random states where it has them
    (the model is loaded by the builder)."""
    s = json.loads((path / "state.json").read_text())
    progress = Progress(
        global_step=s["global_step"],
        stage_index=s["stage_index"],
        stage_step=s["stage_step"],
        problems=s["problems"],
        order=s["order"],
    )
    own = path / rng_file(rank)
    rng = torch.load(own if own.exists() else path / rng_file(0), weights_only=True)
    if not own.exists():
        rng["engines"] = {}  # rank 0's generators would repeat its samples
    optimizer_file = path / "optimizer.pt"
    optimizer = torch.load(optimizer_file, weights_only=True) if optimizer_file.exists() else None
    return Saved(
        path, progress, _rng_from_json(s["python_rng"]), rng["torch"], rng["engines"], optimizer
    )


def _rng_to_json(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_from_json(data: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)
