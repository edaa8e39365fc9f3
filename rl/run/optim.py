"""The optimizers of the stages and their learning-rate schedules.

SFT: AdamW with linear warm-up then cosine decay over the rest of the stage ("cosine"), or a
constant rate whose last `decay_steps` decay to 0 ("constant": warm-up, stable, decay), its own
for each SFT stage. GRPO: AdamW with a
linear warm-up then a constant rate, kept from one GRPO stage to the next (the paper carries it
over, except into stage 3, `reset_optimizer`); a stage that keeps it retargets its rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

LambdaLR = torch.optim.lr_scheduler.LambdaLR


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The SFT rate factor: (step + 1) / warmup during warm-up, then cosine down to 0."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_stable_decay(step: int, warmup: int, total: int, decay: int) -> float:
    """The "constant" SFT rate factor: warm-up, then 1, then cosine down to 0 over the last
    `decay` steps (0: no decay)."""
    if step < warmup:
        return (step + 1) / warmup
    decay_start = total - decay
    if decay <= 0 or step < decay_start:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * (step - decay_start) / decay))


def sft_rate_factor(schedule: str, warmup: int, total: int, decay: int) -> Callable[[int], float]:
    """The SFT stage's rate factor per step, by `StageConfig.lr_schedule`."""
    if schedule == "cosine":
        return lambda s: warmup_cosine(s, warmup, total)
    if schedule == "constant":
        return lambda s: warmup_stable_decay(s, warmup, total, decay)
    raise ValueError(f"unknown SFT learning-rate schedule {schedule!r}")


def warmup_constant(step: int, warmup: int) -> float:
    """The GRPO rate factor: linear warm-up over `warmup` steps, then 1."""
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def sft_optimizer(
    model: Any,
    *,
    lr: float,
    weight_decay: float,
    warmup: int,
    total: int,
    schedule: str = "cosine",
    decay_steps: int = 0,
) -> tuple[torch.optim.AdamW, LambdaLR]:
    """A fresh AdamW and its schedule (`sft_rate_factor`) for one SFT stage."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    return optimizer, LambdaLR(optimizer, sft_rate_factor(schedule, warmup, total, decay_steps))


def grpo_optimizer(
    model: Any, *, lr: float, weight_decay: float, warmup: int
) -> tuple[torch.optim.AdamW, LambdaLR]:
    """A fresh AdamW and its warm-up schedule for GRPO."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    return optimizer, LambdaLR(optimizer, lambda s: warmup_constant(s, warmup))


def retarget(optimizer: torch.optim.Optimizer, schedule: LambdaLR, lr: float) -> None:
    """Keep the optimizer's state and schedule position, with lr as the new base rate."""
    for group in optimizer.param_groups:
        group["initial_lr"] = lr
    schedule.base_lrs = [lr for _ in schedule.base_lrs]
