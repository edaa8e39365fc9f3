"""The short SFT stage that teaches the tool-call format before RL (the recipe's first step).

The loss is the token-mean negative log-likelihood of the trained tokens of tokenized
demonstrations (rl.rollout.demonstrations renders them). torch only: scripts/gpu_check.py runs
this step on hosts without the service's libraries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rl.logprobs import pad_responses, response_logprobs
from rl.parallel.distributed import backward_over_ranks, clip_grad_norm


@dataclass(frozen=True, slots=True)
class SFTExample:
    """A tokenized demonstration."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]


def sft_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    examples: Sequence[SFTExample],
    *,
    pad_id: int,
    micro_batch_size: int,
    micro_batch_tokens: int = 0,
    grad_clip: float = 1.0,
) -> dict[str, float]:
    """One optimizer step of token-mean NLL over the examples' trained tokens (under torchrun:
    the same examples on every rank, each rank a share of them, the step one process takes)."""
    device = next(model.parameters()).device
    total = sum(sum(e.loss_mask) for e in examples)
    if total == 0:
        raise ValueError("no trained tokens in this batch")
    model.train()
    optimizer.zero_grad(set_to_none=True)

    def loss_of(rows: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        part = [examples[i] for i in rows]
        batch = pad_responses(
            [e.prompt_ids for e in part],
            [e.response_ids for e in part],
            [e.loss_mask for e in part],
            pad_id=pad_id,
            device=device,
        )
        logp = response_logprobs(model, batch)
        loss = -(logp * batch.loss_mask).sum() / total
        # A token is "right" when the model gives it more than half the mass (argmax for sure).
        correct = float(((logp.detach() > -0.693) * batch.loss_mask).sum())
        return loss, {"correct": correct}

    lengths = [len(e.prompt_ids) + len(e.response_ids) for e in examples]
    sums = backward_over_ranks(
        lengths,
        micro_batch_tokens or 1 << 62,
        loss_of,
        max_rows=micro_batch_size,
        device=device,
    )
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = clip_grad_norm(params, grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {
        "loss": sums["loss"],
        "token_accuracy": sums.get("correct", 0.0) / total,
        "grad_norm": grad_norm,
    }
