"""The optimizers of the stages and their learning-rate schedules.

SFT: AdamW with linear warm-up then cosine decay, its own for each SFT stage. GRPO: AdamW with a
linear warm-up then a constant rate, kept from one GRPO stage to the next (the paper carries it
over, except into stage 3, `reset_optimizer`); a stage that keeps it retargets its rate.
"""

from __future__ import annotations

import math
from typing import Any

import torch

LambdaLR = torch.optim.lr_scheduler.LambdaLR


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The SFT rate factor: (step + 1) / warmup during warm-up, then cosine down to 0."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_constant(step: int, warmup: int) -> float:
    """The GRPO rate factor: linear warm-up over `warmup` steps, then 1."""
    return min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def sft_optimizer(
    model: Any, *, lr: float, weight_decay: float, warmup: int, total: int
) -> tuple[torch.optim.AdamW, LambdaLR]:
    """A fresh AdamW and its warm-up + cosine schedule for one SFT stage."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    return optimizer, LambdaLR(optimizer, lambda s: warmup_cosine(s, warmup, total))


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
