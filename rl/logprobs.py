"""Token log-probabilities of responses under a causal LM, for the loss and for SFT.

Sequences are prompt + response, right-padded into one (B, L) batch. The response tokens of row i
start at prompt_len[i]; token t is predicted by the logits at t - 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.checkpoint


@dataclass(frozen=True, slots=True)
class ResponseBatch:
    """Padded tensors of B (prompt, response) pairs, on one device.

    input_ids: (B, L) prompt + response, right-padded. attention_mask: (B, L).
    response_ids: (B, T) response tokens, right-padded (T = longest response).
    loss_mask: (B, T) float 1.0 on trained tokens (0 on tool responses and padding).
    prompt_lens: (B,) int64.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    loss_mask: torch.Tensor
    prompt_lens: torch.Tensor

    @property
    def num_tokens(self) -> int:
        """Trained tokens in the batch."""
        return int(self.loss_mask.sum().item())


def pad_responses(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    masks: Sequence[Sequence[int]],
    *,
    pad_id: int,
    device: torch.device | str = "cpu",
) -> ResponseBatch:
    """A ResponseBatch from lists; every response needs at least one token."""
    if not (len(prompts) == len(responses) == len(masks)) or not prompts:
        raise ValueError("need equally many prompts, responses and masks, at least one")
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    longest = max(len(r) for r in responses)
    b = len(prompts)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    response_ids = torch.full((b, longest), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((b, longest), dtype=torch.float32)
    for i, (prompt, response, mask) in enumerate(zip(prompts, responses, masks, strict=True)):
        if not response or len(mask) != len(response) or not prompt:
            raise ValueError(f"row {i}: empty prompt or response, or mask of the wrong length")
        n = len(prompt) + len(response)
        input_ids[i, :n] = torch.tensor([*prompt, *response])
        attention[i, :n] = 1
        response_ids[i, : len(response)] = torch.tensor(response)
        loss_mask[i, : len(response)] = torch.tensor(mask, dtype=torch.float32)
    prompt_lens = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return ResponseBatch(
        input_ids.to(device),
        attention.to(device),
        response_ids.to(device),
        loss_mask.to(device),
        prompt_lens.to(device),
    )


CHUNK_TOKENS = 1024
"""Response positions whose vocabulary logits exist at once (per row) in response_logprobs."""


class LogProbModel(torch.nn.Module):
    """A causal LM whose forward returns the log-probabilities of given tokens, not logits.

    Wrapping the model in a module of its own makes it the root that FSDP2 shards last: its
    unit holds the embeddings, the final norm and the (often tied) output head, which stay
    gathered for the whole forward while the chunks below reuse the head.
    """

    def __init__(self, lm: Any, chunk_tokens: int = CHUNK_TOKENS) -> None:
        super().__init__()
        if chunk_tokens < 1:
            raise ValueError("chunk_tokens must be at least 1")
        self.lm = lm
        self.chunk_tokens = chunk_tokens

    def forward(self, batch: ResponseBatch, temperature: float = 1.0) -> torch.Tensor:
        """(B, T) log pi(response token | everything before it); see response_logprobs."""
        decoder = self.lm.get_decoder()
        head = self.lm.get_output_embeddings()
        hidden = decoder(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False
        ).last_hidden_state
        t = batch.response_ids.shape[1]
        # The hidden state that predicts response token j of row i sits at prompt_len[i] - 1 + j.
        offsets = torch.arange(t, device=hidden.device).unsqueeze(0)
        index = (batch.prompt_lens.unsqueeze(1) - 1 + offsets).clamp(max=hidden.shape[1] - 1)
        picked = hidden.gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        scale = 1.0 / temperature if temperature > 0 else 1.0
        pieces = []
        for start in range(0, t, self.chunk_tokens):
            end = min(start + self.chunk_tokens, t)
            args = (head, picked[:, start:end], batch.response_ids[:, start:end], scale)
            if torch.is_grad_enabled():
                # Recomputed in the backward: only one chunk's logits are ever alive.
                piece = torch.utils.checkpoint.checkpoint(
                    _chosen_logprobs, *args, use_reentrant=False
                )
            else:
                piece = _chosen_logprobs(*args)
            pieces.append(piece)
        token_logp = torch.cat(pieces, dim=1)
        valid = offsets < (batch.attention_mask.sum(1) - batch.prompt_lens).unsqueeze(1)
        return torch.where(valid, token_logp, torch.zeros_like(token_logp))


def _chosen_logprobs(
    head: Any, hidden: torch.Tensor, targets: torch.Tensor, scale: float
) -> torch.Tensor:
    """(B, C) log-softmax of the chosen tokens: fp32 logits of one chunk, (B, C, V), then gone."""
    logits: torch.Tensor = head(hidden).float()
    if scale != 1.0:
        logits = logits * scale
    chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return chosen - torch.logsumexp(logits, dim=-1)


def response_logprobs(
    model: Any, batch: ResponseBatch, *, temperature: float = 1.0
) -> torch.Tensor:
    """(B, T) log pi(response token | everything before it), logits divided by temperature.

    model: a transformers causal LM, or a LogProbModel (the FSDP-sharded form). The full
    (B, L, V) logits never exist: the head runs on response positions only, CHUNK_TOKENS at a
    time. Padding positions hold 0.0 (mask them). Gradients flow unless called under no_grad.
    """
    wrapped = model if isinstance(model, LogProbModel) else LogProbModel(model)
    result: torch.Tensor = wrapped(batch, temperature)
    return result
