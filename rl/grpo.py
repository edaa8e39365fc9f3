"""One GRPO-RoC step on collected rollouts: reward, Resample-on-Correct, advantages, update.

    rewards   r_i in {0, 1} from the answer in the model's own turns; 0 if truncated (§4.3.1)
    kept      roc_select per group of 2G rollouts -> G (rl.roc)
    A_i       (r_i - mean) / (std + eps) over each group's kept rollouts (rl.advantages)
    pi_old    a no-grad forward of the policy before the update (or the sampling log-probs)
    update    token-mean clipped loss (rl.loss) over all kept tokens, AdamW, grad-norm clip

The update splits the kept rollouts into mini-batches of whole groups, in a shuffled order (one
optimizer step each), and each mini-batch into micro-batches of similar lengths (little padding)
whose padded size fits a token budget; gradients accumulate over micro-batches, and the
token-mean's denominator is the whole mini-batch's token count, so a token weighs the same
whichever micro-batch it falls in. Under torchrun the same code runs on every rank with the
same rows: each rank takes a balanced share of each mini-batch's rows (rl.parallel), FSDP sums
the gradients, so N ranks take the optimizer step one process would on the same batch.
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
from rl.parallel.distributed import (
    backward_over_ranks,
    clip_grad_norm,
    gather_objects,
    my_micro_batches,
)
from rl.penalties import is_infrastructure_failure, total_penalty
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
    infra_masked: int = 0
    """Rollouts left out because a tool call met an infrastructure status (met_infrastructure)."""


def met_infrastructure(trajectory: Trajectory) -> bool:
    """Whether a tool call of the rollout got an infrastructure status (queue_timeout,
    sandbox_error, cancelled, deadline_exceeded): the model read a response that says nothing of
    its program, so neither its reward nor its tokens are evidence about the policy."""
    return any(is_infrastructure_failure(record) for record in trajectory.tool_results)


def final_rewards(trajectories: Sequence[Trajectory], correct: Sequence[float]) -> list[float]:
    """The answer's reward, except 0.0 for a truncated rollout."""
    return [0.0 if t.truncated else r for t, r in zip(trajectories, correct, strict=True)]


def select_and_weigh(
    trajectories: Sequence[Trajectory],
    rewards: Sequence[float],
    config: GRPOConfig,
    rng: random.Random,
) -> Selection:
    """Resample-on-Correct within each group, then group advantages over the kept ones.

    Rollouts that met an infrastructure status are kept out first (not resampled): the group's
    other rollouts are ranked and weighed among themselves, as a smaller group (docs/rl.md).
    """
    groups: dict[int, list[int]] = defaultdict(list)
    masked = 0
    for i, t in enumerate(trajectories):
        if met_infrastructure(t):
            masked += 1
            groups.setdefault(t.group, [])
        else:
            groups[t.group].append(i)
    selection = Selection(groups=len(groups), infra_masked=masked)
    for members in groups.values():
        if not members:
            selection.dropped_groups += 1
            continue
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


def _lengths(trajectories: Sequence[Trajectory], rows: Sequence[int]) -> list[int]:
    return [len(trajectories[i].prompt_ids) + len(trajectories[i].response_ids) for i in rows]


@dataclass(frozen=True, slots=True)
class MicroBatching:
    """How a set of rows is cut into forward/backward passes."""

    token_budget: int = 1 << 62
    """Padded tokens (rows x longest prompt + response) per pass at most; a longer row goes
    alone. The default: no bound."""
    max_rows: int = 16
    """Rows per pass at most (0: no bound)."""


def old_logprobs(
    model: Any,
    trajectories: Sequence[Trajectory],
    *,
    pad_id: int,
    batching: MicroBatching,
    recompute: bool,
    temperature: float,
) -> tuple[dict[int, torch.Tensor], float | None]:
    """log pi_old of each trajectory's response tokens, (T_i,) each; and the mean |difference|
    from the sampling log-probs on trained tokens (None when not recomputed).

    recompute: a no-grad forward of the current policy (the update's pi_old), each rank on its
    share of the rows, then exchanged; else the log-probs the engine reported when sampling.
    """
    if not recompute:
        return {
            i: torch.tensor(t.logprobs[: len(t.response_ids)], dtype=torch.float32)
            for i, t in enumerate(trajectories)
        }, None
    device = next(model.parameters()).device
    mine: dict[int, list[float]] = {}
    mismatch_sum, mismatch_n = 0.0, 0
    was_training = model.training
    model.eval()
    lengths = _lengths(trajectories, range(len(trajectories)))
    for rows in my_micro_batches(
        lengths, batching.token_budget, max_rows=batching.max_rows, device=device
    ):
        batch = _batch(trajectories, rows or [0], pad_id, device)
        with torch.no_grad():
            source = response_logprobs(model, batch, temperature=temperature).float().cpu()
        for j, i in enumerate(rows):
            n = len(trajectories[i].response_ids)
            mine[i] = source[j, :n].tolist()
            lp = torch.tensor(trajectories[i].logprobs[:n], dtype=torch.float32)
            mask = batch.loss_mask[j, : len(lp)].cpu()
            mismatch_sum += float(((source[j, : len(lp)] - lp).abs() * mask).sum())
            mismatch_n += int(mask.sum())
    model.train(was_training)
    old: dict[int, torch.Tensor] = {}
    total_sum, total_n = 0.0, 0
    for part, part_sum, part_n in gather_objects((mine, mismatch_sum, mismatch_n)):
        old.update({i: torch.tensor(v, dtype=torch.float32) for i, v in part.items()})
        total_sum, total_n = total_sum + part_sum, total_n + part_n
    return old, total_sum / max(total_n, 1)


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
    batching: MicroBatching,
    temperature: float,
) -> dict[str, float]:
    """One optimizer step on the given rows (the same on every rank); its loss, grad norm and
    token-summed loss metrics, over all ranks."""
    device = next(model.parameters()).device
    part_tokens = sum(sum(trajectories[i].loss_mask) for i in rows)
    optimizer.zero_grad(set_to_none=True)

    def loss_of(picked: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        micro = [rows[k] for k in picked]
        batch = _batch(trajectories, micro, pad_id, device)
        logp = response_logprobs(model, batch, temperature=temperature)
        old_logp = torch.zeros_like(logp)
        for j, i in enumerate(micro):
            old_logp[j, : old[i].shape[0]] = old[i].to(device=device, dtype=logp.dtype)
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
        sums = {
            key: value if key == "num_tokens" else value * metrics.num_tokens
            for key, value in metrics.as_dict().items()
        }
        return loss, sums

    sums = backward_over_ranks(
        _lengths(trajectories, rows),
        batching.token_budget,
        loss_of,
        max_rows=batching.max_rows,
        device=device,
    )
    params = [p for p in model.parameters() if p.grad is not None]
    sums["grad_norm"] = clip_grad_norm(params, config.grad_clip)
    optimizer.step()
    return sums


def policy_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    config: GRPOConfig,
    *,
    pad_id: int,
    batching: MicroBatching | None = None,
    minibatches: int = 1,
    recompute_old_logprobs: bool = True,
    temperature: float = 1.0,
    rng: random.Random | None = None,
) -> dict[str, float]:
    """Clipped policy-gradient update(s) on the kept rollouts; returns averaged metrics.

    loss and grad_norm are means over the optimizer steps taken; the loss's diagnostics
    (clip fractions, approx_kl) are means over trained tokens. Under torchrun every rank calls
    it with the same rollouts, advantages and rng state.
    """
    if len(trajectories) != len(advantages) or not trajectories:
        raise ValueError("need one advantage per trajectory, at least one trajectory")
    batching = batching or MicroBatching()
    old, mismatch = old_logprobs(
        model,
        trajectories,
        pad_id=pad_id,
        batching=batching,
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
            batching=batching,
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
