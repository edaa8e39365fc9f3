"""The GRPO-RoC policy loss (paper Eq. 6): token-level clipped surrogate with Clip-Higher.

    rho_t = pi_theta(o_t | ...) / pi_old(o_t | ...)
    l_t   = -min(rho_t * A, clip(rho_t, 1 - eps_low, 1 + eps_high) * A)
    dual clip (release only, c = 3): for A < 0, l_t = min(l_t, -c * A)
    loss  = sum_t(l_t * mask_t) / sum_t(mask_t)            (token mean over the batch)

No KL term and no entropy term (paper §2.2.3). The mask is 1 on model-generated response
tokens only: prompt, tool-response and padding tokens are 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# exp() of a log-ratio past this is inf or 0 in float32; VERL clamps the same way.
_MAX_LOG_RATIO = 20.0


@dataclass(frozen=True, slots=True)
class LossMetrics:
    """Diagnostics of one loss call, all detached, averaged over masked tokens."""

    clip_frac: torch.Tensor
    """Share of tokens whose clipped term was taken (no gradient from them)."""
    clip_frac_low: torch.Tensor
    """Share clipped below: ratio < 1 - eps_low with a negative advantage."""
    clip_frac_high: torch.Tensor
    """Share clipped above: ratio > 1 + eps_high with a positive advantage."""
    dual_clip_frac: torch.Tensor
    """Share where the dual clip bound -c * A was taken (0 without dual clip)."""
    approx_kl: torch.Tensor
    """KL(pi_old || pi_theta) estimate, mean of (rho - 1) - log rho (Schulman's k3)."""
    num_tokens: int
    """Masked tokens in this call."""

    def as_dict(self) -> dict[str, float]:
        """Plain floats for logging (synchronises with the device)."""
        return {
            "clip_frac": float(self.clip_frac),
            "clip_frac_low": float(self.clip_frac_low),
            "clip_frac_high": float(self.clip_frac_high),
            "dual_clip_frac": float(self.dual_clip_frac),
            "approx_kl": float(self.approx_kl),
            "num_tokens": float(self.num_tokens),
        }


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, LossMetrics]:
    """Token-mean clipped policy loss (to minimise) and its metrics.

    logprobs: (B, T) log pi_theta of each response token, with grad.
    old_logprobs: (B, T) log pi_old of the same tokens (no grad needed).
    advantages: (B,) one per trajectory, or (B, T) per token.
    loss_mask: (B, T) bool or 0/1; 1 only on tokens the model generated.
    dual_clip: c > 1 for the dual clip on negative advantages; None (the paper) for none.
    num_tokens: the token-mean's denominator; pass the whole mini-batch's masked-token count
        when accumulating gradients over micro-batches, so each token weighs the same.
    Returns a scalar loss and LossMetrics.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != loss_mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
            f"loss_mask {tuple(loss_mask.shape)} must have one shape (B, T)"
        )
    if advantages.ndim == 1 and advantages.shape[0] == logprobs.shape[0]:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)
    if advantages.shape != logprobs.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} must be (B,) or (B, T)")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError("dual_clip must be greater than 1")

    mask = loss_mask.to(logprobs.dtype)
    advantages = advantages.to(logprobs.dtype)
    log_ratio = torch.clamp(logprobs - old_logprobs, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        per_token = torch.where(advantages < 0, torch.minimum(per_token, bound), per_token)

    count = int(mask.sum().item())
    denominator = float(num_tokens) if num_tokens is not None else float(max(count, 1))
    loss = (per_token * mask).sum() / denominator

    with torch.no_grad():
        n = max(count, 1)
        on = mask > 0
        took_clip = (clipped > unclipped) & on
        dual = torch.zeros_like(on)
        if dual_clip is not None:
            dual = (advantages < 0) & (-advantages * dual_clip < torch.maximum(unclipped, clipped))
            dual &= on
        metrics = LossMetrics(
            clip_frac=took_clip.sum() / n,
            clip_frac_low=(took_clip & (ratio < 1.0 - eps_low)).sum() / n,
            clip_frac_high=(took_clip & (ratio > 1.0 + eps_high)).sum() / n,
            dual_clip_frac=dual.sum() / n,
            approx_kl=(((ratio - 1.0) - log_ratio) * mask).sum() / n,
            num_tokens=count,
        )
    return loss, metrics
