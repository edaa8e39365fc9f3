"""One GRPO-RoC step on collected rollouts: reward, Resample-on-Correct, advantages, update.

    rewards   r_i in {0, 1} from the answer in the model's own turns; 0 if truncated (§4.3.1)
    kept      roc_select per group of 2G rollouts -> G (rl.roc)
    A_i       (r_i - mean) / (std + eps) over each group's kept rollouts (rl.advantages)
    pi_old    a no-grad forward of the policy before the update (or the sampling log-probs)
    update    token-mean clipped loss (rl.loss) over all kept tokens, AdamW, grad-norm clip

The update splits the kept rollouts into mini-batches of whole groups, in a shuffled order (one
optimizer step each), and each mini-batch into micro-batches sorted by length (little padding);
gradients accumulate over micro-batches, and the token-mean's denominator is the whole
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
from rl.logprobs import ResponseBatch, pad_responses, response_logprobs
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
        selection.kept.extend(kept)
        selection.kept_pos += sum(rewards[i] > 0 for i in kept)
        selection.kept_neg += sum(rewards[i] <= 0 for i in kept)
    if selection.kept:
        advantages = group_advantages(
            [rewards[i] for i in selection.kept],
            [trajectories[i].group for i in selection.kept],
            eps=config.adv_eps,
        )
        selection.advantages = [float(a) for a in advantages]
    return selection


def _chunks(items: Sequence[int], size: int) -> list[list[int]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def minibatch_partition(
    groups: Sequence[int], minibatches: int, rng: random.Random | None = None
) -> list[list[int]]:
    """Row indices split into at most `minibatches` parts of whole groups, groups shuffled.

    groups: the group of each row. A part never splits a group (its advantages are relative to
    each other) and parts are not length bands: each optimizer step sees a random mix. Fewer
    groups than mini-batches gives one part per group. rng None keeps the groups' first-seen order.
    """
    if minibatches < 1:
        raise ValueError(f"minibatches must be at least 1, got {minibatches}")
    members: dict[int, list[int]] = defaultdict(list)
    for row, group in enumerate(groups):
        members[group].append(row)
    order = list(members)
    if rng is not None:
        rng.shuffle(order)
    n = min(minibatches, len(order))
    # Deal groups into n parts of nearly equal group count (the first len % n get one more).
    size, extra = divmod(len(order), n) if n else (0, 0)
    parts: list[list[int]] = []
    start = 0
    for k in range(n):
        stop = start + size + (1 if k < extra else 0)
        parts.append([row for group in order[start:stop] for row in members[group]])
        start = stop
    return parts


def _batch(
    trajectories: Sequence[Trajectory], rows: Sequence[int], pad_id: int, device: torch.device
) -> ResponseBatch:
    return pad_responses(
        [trajectories[i].prompt_ids for i in rows],
        [trajectories[i].response_ids for i in rows],
        [trajectories[i].loss_mask for i in rows],
        pad_id=pad_id,
        device=device,
    )


def _by_length(trajectories: Sequence[Trajectory], rows: Sequence[int]) -> list[int]:
    return sorted(rows, key=lambda i: len(trajectories[i].response_ids))


def old_logprobs(
    model: Any,
    trajectories: Sequence[Trajectory],
    *,
    pad_id: int,
    micro_batch_size: int,
    recompute: bool,
    temperature: float,
) -> tuple[dict[int, torch.Tensor], float | None]:
    """log pi_old of each trajectory's response tokens, (T_i,) each; and the mean |difference|
    from the sampling log-probs on trained tokens (None when not recomputed).

    recompute: a no-grad forward of the current policy (the update's pi_old); else the
    log-probs the engine reported when sampling.
    """
    device = next(model.parameters()).device
    old: dict[int, torch.Tensor] = {}
    mismatch_sum, mismatch_n = 0.0, 0
    for rows in _chunks(_by_length(trajectories, range(len(trajectories))), micro_batch_size):
        batch = _batch(trajectories, rows, pad_id, device)
        sampled = torch.zeros_like(batch.loss_mask)
        for j, i in enumerate(rows):
            lp = trajectories[i].logprobs
            sampled[j, : len(lp)] = torch.tensor(lp, dtype=torch.float32)
        source = sampled
        if recompute:
            was_training = model.training
            model.eval()
            with torch.no_grad():
                source = response_logprobs(model, batch, temperature=temperature)
            model.train(was_training)
            mismatch_sum += float(((source - sampled).abs() * batch.loss_mask).sum())
            mismatch_n += batch.num_tokens
        for j, i in enumerate(rows):
            old[i] = source[j, : len(trajectories[i].response_ids)].detach()
    return old, (mismatch_sum / max(mismatch_n, 1) if recompute else None)


def minibatch_step(
    model: Any,
    optimizer: torch.optim.Optimizer,
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    old: dict[int, torch.Tensor],
    rows: Sequence[int],
    config: GRPOConfig,
    *,
    pad_id: int,
    micro_batch_size: int,
    temperature: float,
) -> dict[str, float]:
    """One optimizer step on the given rows; its loss, grad norm and token-summed loss metrics."""
    device = next(model.parameters()).device
    part_tokens = sum(sum(trajectories[i].loss_mask) for i in rows)
    sums: dict[str, float] = defaultdict(float)
    optimizer.zero_grad(set_to_none=True)
    for micro in _chunks(_by_length(trajectories, rows), micro_batch_size):
        batch = _batch(trajectories, micro, pad_id, device)
        logp = response_logprobs(model, batch, temperature=temperature)
        old_logp = torch.zeros_like(logp)
        for j, i in enumerate(micro):
            old_logp[j, : old[i].shape[0]] = old[i]
        adv = torch.tensor([advantages[i] for i in micro], device=device)
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
        sums["loss"] += float(loss.detach())
        for key, value in metrics.as_dict().items():
            sums[key] += value if key == "num_tokens" else value * metrics.num_tokens
    params = [p for p in model.parameters() if p.grad is not None]
    sums["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, config.grad_clip))
    optimizer.step()
    return dict(sums)


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
    rng: random.Random | None = None,
) -> dict[str, float]:
    """Clipped policy-gradient update(s) on the kept rollouts; returns averaged metrics.

    loss and grad_norm are means over the optimizer steps taken; the loss's diagnostics
    (clip fractions, approx_kl) are means over trained tokens.
    """
    if len(trajectories) != len(advantages) or not trajectories:
        raise ValueError("need one advantage per trajectory, at least one trajectory")
    old, mismatch = old_logprobs(
        model,
        trajectories,
        pad_id=pad_id,
        micro_batch_size=micro_batch_size,
        recompute=recompute_old_logprobs,
        temperature=temperature,
    )
    model.train()
    steps = [
        minibatch_step(
            model,
            optimizer,
            trajectories,
            advantages,
            old,
            rows,
            config,
            pad_id=pad_id,
            micro_batch_size=micro_batch_size,
            temperature=temperature,
        )
        for rows in minibatch_partition([t.group for t in trajectories], minibatches, rng)
    ]
    optimizer.zero_grad(set_to_none=True)
    tokens = sum(s["num_tokens"] for s in steps)
    keys = {k for s in steps for k in s} - {"loss", "grad_norm", "num_tokens"}
    out = {k: sum(s.get(k, 0.0) for s in steps) / max(tokens, 1) for k in sorted(keys)}
    out["loss"] = sum(s["loss"] for s in steps) / len(steps)
    out["grad_norm"] = sum(s["grad_norm"] for s in steps) / len(steps)
    out["trained_tokens"] = float(tokens)
    out["optimizer_steps"] = float(len(steps))
    if mismatch is not None:
        out["logprob_mismatch"] = mismatch
    return out
