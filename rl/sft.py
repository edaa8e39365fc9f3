"""The short SFT stage that teaches the tool-call format before RL (the recipe's first step).

Demonstrations are rendered exactly as rollouts are: the assistant's turns are trained (mask 1),
and the tool responses between them are the real responses of the sandbox to the
demonstration's own calls (mask 0). The loss is the token-mean negative log-likelihood of the
trained tokens.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rl.data.tasks import Demonstration
from rl.logprobs import pad_responses, response_logprobs
from rl.parallel.distributed import backward_over_ranks
from rl.rollout.loop import Codec, RolloutSettings, execute_call
from rl.rollout.template import PromptTemplate, demonstration
from trainer_client.tools import Executes, parse_tool_calls


@dataclass(frozen=True, slots=True)
class SFTExample:
    """A tokenized demonstration."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]


async def _render_one(
    demo: Demonstration,
    template: PromptTemplate,
    codec: Codec,
    tools: Executes,
    settings: RolloutSettings,
) -> SFTExample:
    responses = []
    for number, turn in enumerate(demo.turns[:-1], 1):
        calls = parse_tool_calls(turn)
        if not calls:
            raise ValueError(f"demonstration turn {number} has no tool call: {turn[:80]!r}")
        record = await execute_call(tools, calls[0], number, settings)
        responses.append(record.text)
    pieces = demonstration(template, list(demo.turns), responses)
    if demo.hidden:
        text, _ = pieces[-1]
        at = text.rindex(demo.hidden)
        end = at + len(demo.hidden)
        pieces[-1:] = [(text[:at], True), (text[at:end], False), (text[end:], True)]
    response: list[int] = []
    mask: list[int] = []
    for text, trained in pieces:
        ids = codec.encode(text)
        response.extend(ids)
        mask.extend([int(trained)] * len(ids))
    return SFTExample(codec.encode(template.prompt(demo.question)), response, mask)


async def render_demonstrations(
    demos: Sequence[Demonstration],
    template: PromptTemplate,
    codec: Codec,
    tools: Executes,
    settings: RolloutSettings,
) -> list[SFTExample]:
    """Tokenize demonstrations, running their tool calls in the sandbox (all concurrently)."""
    return list(
        await asyncio.gather(*(_render_one(d, template, codec, tools, settings) for d in demos))
    )


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
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, grad_clip))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {
        "loss": sums["loss"],
        "token_accuracy": sums.get("correct", 0.0) / total,
        "grad_norm": grad_norm,
    }
