"""Checkpoints: what a run needs to go on exactly where it stopped, and which ones to keep.

checkpoints/<tag>/ holds the model and tokenizer (transformers' save_pretrained), optimizer.pt
(the GRPO optimizer and its schedule, when one exists), rng.pt (torch's generator and each
engine's sampling generator) and state.json (the counters: global step, stage, step inside it,
the stage's problems after its filter, where its draw order stands, Resample-on-Correct's
random state). Tags are `step-NNNNN` (every `checkpoint_every` RL steps; only the newest
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


def save_checkpoint(
    path: Path,
    *,
    model: Any,
    tokenizer: Any,
    progress: Progress,
    rng: random.Random,
    optimizer: torch.optim.Optimizer | None,
    schedule: torch.optim.lr_scheduler.LRScheduler | None,
    warmup_steps: int,
    engine_rng: dict[str, torch.Tensor],
) -> None:
    """Write everything a resume needs under path (written last: state.json)."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if optimizer is not None and schedule is not None:
        torch.save(
            {
                "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(),
                "warmup_steps": warmup_steps,
            },
            path / "optimizer.pt",
        )
    torch.save({"torch": torch.get_rng_state(), "engines": engine_rng}, path / "rng.pt")
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


def load_checkpoint(path: Path) -> Saved:
    """Read a checkpoint's counters and states (the model is loaded by the builder)."""
    s = json.loads((path / "state.json").read_text())
    progress = Progress(
        global_step=s["global_step"],
        stage_index=s["stage_index"],
        stage_step=s["stage_step"],
        problems=s["problems"],
        order=s["order"],
    )
    rng = torch.load(path / "rng.pt", weights_only=True)
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
