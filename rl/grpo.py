"""One GRPO-RoC step on collected rollouts: reward, Resample-on-Correct, advantages, update.

    rewards   r_i in {0, 1} from the answer in the model's own turns; 0 if truncated (§4.3.1)
    kept      roc_select per group of 2G rollouts -> G (rl.roc)
    A_i       (r_i - mean) / (std + eps) over each group's kept rollouts (rl.advantages)
    pi_old    a no-grad forward of the policy before the update (or the sampling log-probs)
    update    token-mean clipped loss (rl.loss) over all kept tokens, AdamW, grad-norm clip

The update accumulates gradients over micro-batches; the token-mean's denominator is the whole
mini-batch's token count, so a token weighs the same whichever micro-batch it falls in.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rl.advantages import group_advantages
from rl.config import GRPOConfig
from rl.logprobs import pad_responses, response_logprobs
from rl.loss import policy_loss
from rl.penalties import total_penalty
from rl.roc import roc_select
from rl.trajectory import Trajectory


@dataclass(slots=True)
class Selection:
    """Which rollouts of a step are trained on, and with what advantage."""

    kept: list[int] = field(default_factory=list)
    """Indices into the step's rollouts."""
    advantages: list[float] = field(default_factory=list)
    """One per kept rollout."""
    groups: int = 0
    dropped_groups: int = 0
    """Groups whose rewards were all equal (no signal)."""
    kept_pos: int = 0
    kept_neg: int = 0


def final_rewards(trajectories: Sequence[Trajectory], correct: Sequence[float]) -> list[float]:
    """The answer's reward, except 0.0 for a truncated rollout."""
    return [0.0 if t.truncated else r for t, r in zip(trajectories, correct, strict=True)]


def select_and_weigh(
    trajectories: Sequence[Trajectory],
    rewards: Sequence[float],
    config: GRPOConfig,
    rng: random.Random,
) -> Selection:
    """Resample-on-Correct within each group, then group advantages over the kept ones."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        groups[t.group].append(i)
    selection = Selection(groups=len(groups))
    for members in groups.values():
        penalties = [
            total_penalty(
                trajectories[i].response_text,
                trajectories[i].tool_results,
                max(trajectories[i].num_turns, 1),
                err_detector=config.err_detector,
                format_rule=config.format_rule,
                use_err=config.use_err_penalty,
                use_format=config.use_format_penalty,
            )
            for i in members
        ]
        chosen = roc_select(
            [rewards[i] for i in members],
            penalties,
            config.group_size,
            mode=config.roc_mode,
            min_pos=config.min_pos,
            min_neg=config.min_neg,
            rng=rng,
            eps=config.sample_eps,
        )
        if not chosen:
            selection.dropped_groups += 1
            continue
        kept = [members[j] for j in chosen]
        advantages = group_advantages([rewards[i] for i in kept], eps=config.adv_eps)
        selection.kept.extend(kept)
        selection.advantages.extend(float(a) for a in advantages)
        selection.kept_pos += sum(rewards[i] > 0 for i in kept)
        selection.kept_neg += sum(rewards[i] <= 0 for i in kept)
    return selection


def _chunks(items: Sequence[int], size: int) -> list[list[int]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def policy_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    config: GRPOConfig,
    *,
    pad_id: int,
    micro_batch_size: int = 16,
    minibatches: int = 1,
    recompute_old_logprobs: bool = True,
    temperature: float = 1.0,
) -> dict[str, float]:
    """Clipped policy-gradient update(s) on the kept rollouts; returns averaged metrics."""
    if len(trajectories) != len(advantages) or not trajectories:
        raise ValueError("need one advantage per trajectory, at least one trajectory")
    device = next(model.parameters()).device
    # Sort by length so micro-batches carry little padding.
    order = sorted(range(len(trajectories)), key=lambda i: len(trajectories[i].response_ids))

    def batch_of(rows: list[int]) -> Any:
        return pad_responses(
            [trajectories[i].prompt_ids for i in rows],
            [trajectories[i].response_ids for i in rows],
            [trajectories[i].loss_mask for i in rows],
            pad_id=pad_id,
            device=device,
        )

    old: dict[int, torch.Tensor] = {}
    mismatch_sum, mismatch_n = 0.0, 0
    for rows in _chunks(order, micro_batch_size):
        batch = batch_of(rows)
        sampled = torch.zeros_like(batch.loss_mask)
        for j, i in enumerate(rows):
            lp = trajectories[i].logprobs
            sampled[j, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        if recompute_old_logprobs:
            was_training = model.training
            model.eval()
            with torch.no_grad():
                recomputed = response_logprobs(model, batch, temperature=temperature)
            model.train(was_training)
            diff = (recomputed - sampled).abs() * batch.loss_mask
            mismatch_sum += float(diff.sum())
            mismatch_n += batch.num_tokens
            source = recomputed
        else:
            source = sampled
        for j, i in enumerate(rows):
            old[i] = source[j, : len(trajectories[i].response_ids)].detach()

    totals: dict[str, float] = defaultdict(float)
    tokens_seen = 0
    grad_norms = []
    model.train()
    for part in _chunks(order, -(-len(order) // minibatches)):
        part_tokens = sum(sum(trajectories[i].loss_mask) for i in part)
        optimizer.zero_grad(set_to_none=True)
        for rows in _chunks(part, micro_batch_size):
            batch = batch_of(rows)
            logp = response_logprobs(model, batch, temperature=temperature)
            old_logp = torch.zeros_like(logp)
            for j, i in enumerate(rows):
                old_logp[j, : old[i].shape[0]] = old[i]
            adv = torch.tensor([advantages[i] for i in rows], device=device)
            loss, metrics = policy_loss(
                logp,
                old_logp,
                adv,
                batch.loss_mask,
                eps_low=config.eps_low,
                eps_high=config.eps_high,
                dual_clip=config.dual_clip,
                num_tokens=part_tokens,
            )
            loss.backward()  # type: ignore[no-untyped-call]
            totals["loss"] += float(loss.detach())
            for key, value in metrics.as_dict().items():
                if key != "num_tokens":
                    totals[key] += value * metrics.num_tokens
            tokens_seen += metrics.num_tokens
        params = [p for p in model.parameters() if p.grad is not None]
        grad_norms.append(float(torch.nn.utils.clip_grad_norm_(params, config.grad_clip)))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    out = {k: v / max(tokens_seen, 1) for k, v in totals.items() if k != "loss"}
    out["loss"] = totals["loss"] / minibatches
    out["grad_norm"] = sum(grad_norms) / len(grad_norms)
    out["trained_tokens"] = float(tokens_seen)
    if recompute_old_logprobs:
        out["logprob_mismatch"] = mismatch_sum / max(mismatch_n, 1)
    return out
