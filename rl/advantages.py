"""GRPO advantages (paper Eq. 7): each reward standardised within its kept group.

A_i = (r_i - mean(r)) / (std(r) + eps), std unbiased (n - 1), over the G rollouts that
Resample-on-Correct kept, not the 2G generated. As in VERL, a group of one gets mean 0, std 1.
Every group of a step at once, with no Python loop over groups; the per-group loop that writes
Eq. 7 out is the test's reference (tests/rl/test_rl_advantages.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_advantages(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[int] | torch.Tensor | None = None,
    *,
    eps: float = 1e-6,
) -> torch.Tensor:
    """(r - group mean) / (group's unbiased std + eps) for every rollout.

    rewards: (N,). group_ids: (N,) int, the group of each rollout (any labels, any order);
    None: all one group. Returns (N,) float32 (the rewards' dtype if already floating).
    """
    r = torch.as_tensor(rewards)
    r = r if r.is_floating_point() else r.to(torch.float32)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(r.shape)}")
    if group_ids is None:
        groups = torch.zeros(r.shape, dtype=torch.long, device=r.device)
    else:
        groups = torch.as_tensor(group_ids, dtype=torch.long, device=r.device)
    if groups.shape != r.shape:
        raise ValueError("rewards and group_ids must both have shape (N,)")
    if r.numel() == 0:
        return r.clone()
    _, inverse = torch.unique(groups, return_inverse=True)
    n_groups = int(inverse.max().item()) + 1
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(
        0, inverse, torch.ones_like(r)
    )
    mean = torch.zeros_like(count).index_add_(0, inverse, r) / count
    centred = r - mean[inverse]
    sq = torch.zeros_like(count).index_add_(0, inverse, centred * centred)
    # A singleton group: mean 0 and std 1, as in VERL.
    std = torch.where(count > 1, torch.sqrt(sq / (count - 1).clamp(min=1)), torch.ones_like(count))
    mean = torch.where(count > 1, mean, torch.zeros_like(mean))
    return (r - mean[inverse]) / (std[inverse] + eps)
