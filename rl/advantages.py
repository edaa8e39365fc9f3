"""GRPO advantages (paper Eq. 7): each reward standardised within its kept group.

A_i = (r_i - mean(r)) / (std(r) + eps), std unbiased (n - 1), over the G rollouts that
Resample-on-Correct kept, not the 2G generated. As in VERL, a group of one gets mean 0, std 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(rewards: Sequence[float] | torch.Tensor, *, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean) / (unbiased std + eps) over one group.

    rewards: (G,). Returns (G,) float32 (the rewards' dtype if already floating).
    """
    r = torch.as_tensor(rewards)
    r = r if r.is_floating_point() else r.to(torch.float32)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(r.shape)}")
    if r.numel() == 0:
        return r.clone()
    if r.numel() == 1:
        return r / (1.0 + eps)
    return (r - r.mean()) / (r.std(unbiased=True) + eps)


def batch_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, *, eps: float = 1e-6
) -> torch.Tensor:
    """group_advantages for many groups at once, without a Python loop.

    rewards: (N,) float. group_ids: (N,) int64, the group of each rollout (any labels, any
    order). Returns (N,) advantages of rewards' dtype.
    """
    if rewards.ndim != 1 or group_ids.shape != rewards.shape:
        raise ValueError("rewards and group_ids must both have shape (N,)")
    r = rewards if rewards.is_floating_point() else rewards.to(torch.float32)
    _, inverse = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(
        0, inverse, torch.ones_like(r)
    )
    total = torch.zeros_like(count).index_add_(0, inverse, r)
    mean = total / count
    centred = r - mean[inverse]
    sq = torch.zeros_like(count).index_add_(0, inverse, centred * centred)
    # A singleton group: mean 0 and std 1, as in VERL (and group_advantages).
    std = torch.where(count > 1, torch.sqrt(sq / (count - 1).clamp(min=1)), torch.ones_like(count))
    mean = torch.where(count > 1, mean, torch.zeros_like(mean))
    return (r - mean[inverse]) / (std[inverse] + eps)
