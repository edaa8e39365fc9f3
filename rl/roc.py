"""Resample-on-Correct (paper §2.2.3): which rollouts of one question's group to train on.

From 2G rollouts keep G: every kind of failure, sampled uniformly, but among the successes
prefer the clean ones (few failed tool calls, one answer), so the policy does not learn from
lucky trajectories full of tool errors. Counts follow the release (the paper says "half" and
leaves odd counts open):

    m = len(group); m < keep: drop the group; m == keep: keep it all
    k_pos = round(|pos| * keep / m), k_neg = round(|neg| * keep / m)   (round half to even)
    k_pos + k_neg != keep (only possible for odd keep) -> k_neg = keep - k_pos
    k_neg < min_neg and k_pos < min_pos        -> keep the whole group
    k_neg <= min(min_neg, |neg|)               -> k_neg = min(min_neg, |neg|), k_pos = keep - k_neg
    then k_pos <= min(min_pos, |pos|)          -> k_pos = min(min_pos, |pos|), k_neg = keep - k_pos

Which ones, by mode:

| mode    | positives (reward > 0)                               | negatives                  |
|---------|------------------------------------------------------|----------------------------|
| release | lowest penalty first, stable sort (ties: lower index) | the first k_neg, in order  |
| paper   | drawn without replacement, P ~ 1/(penalty + eps)      | drawn uniformly            |

A group whose rewards are all equal carries no signal under GRPO and is dropped (returns []).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from fractions import Fraction

from rl.config import RocMode


def quotas(
    n_pos: int, n_neg: int, keep: int, *, min_pos: int = 2, min_neg: int = 2
) -> tuple[int, int]:
    """(k_pos, k_neg) for a group of n_pos + n_neg > keep rollouts, by the release's rules.

    Returns (n_pos, n_neg), the whole group, when both shares fall below their minimums.
    """
    m = n_pos + n_neg
    if m <= keep:
        raise ValueError(f"a group of {m} cannot be down-sampled to {keep}")
    # Fraction, not float: round() of a Fraction rounds half to even exactly, as the release's
    # round() does on floats that happen to be exact.
    k_pos = round(Fraction(n_pos * keep, m))
    k_neg = round(Fraction(n_neg * keep, m))
    if k_pos + k_neg != keep:
        # Both shares end in .5 and round the same way, e.g. 3 + 11 -> 7 gives 2 + 6: the
        # release asserts and stops. keep - k_pos is the same count wherever the release runs,
        # and never more than n_neg.
        k_neg = keep - k_pos
    if k_neg < min_neg and k_pos < min_pos:
        return n_pos, n_neg
    if k_neg <= min(min_neg, n_neg):
        k_neg = min(min_neg, n_neg)
        k_pos = keep - k_neg
    if k_pos <= min(min_pos, n_pos):
        k_pos = min(min_pos, n_pos)
        k_neg = keep - k_pos
    return k_pos, k_neg


def _weighted_sample(
    items: Sequence[int], weights: Sequence[float], k: int, rng: random.Random
) -> list[int]:
    """k items without replacement; each draw picks a remaining item with P ~ its weight."""
    items = list(items)
    weights = list(weights)
    chosen = []
    for _ in range(k):
        x = rng.random() * math.fsum(weights)
        j = len(items) - 1  # if rounding leaves x at the total, the last item
        acc = 0.0
        for i, weight in enumerate(weights):
            acc += weight
            if x < acc:
                j = i
                break
        chosen.append(items.pop(j))
        weights.pop(j)
    return chosen


def roc_select(
    rewards: Sequence[float],
    penalties: Sequence[float],
    keep: int,
    *,
    mode: RocMode = "paper",
    min_pos: int = 2,
    min_neg: int = 2,
    rng: random.Random | None = None,
    eps: float = 0.1,
) -> list[int]:
    """Sorted indices of the rollouts of one group to keep; [] drops the group.

    rewards, penalties: one per rollout (penalties matter for positives only, lower = cleaner).
    eps: paper mode's weight is 1 / (penalty + eps); not from the paper, which leaves 1/0 open.
    """
    if len(rewards) != len(penalties):
        raise ValueError(f"{len(rewards)} rewards but {len(penalties)} penalties")
    if keep < 1 or min_pos < 0 or min_neg < 0 or min_pos + min_neg > keep:
        raise ValueError("need keep >= 1, min_pos, min_neg >= 0 and min_pos + min_neg <= keep")
    if mode not in ("paper", "release"):
        raise ValueError(f"mode {mode!r} is not 'paper' or 'release'")
    m = len(rewards)
    if m == 0 or all(r == rewards[0] for r in rewards) or m < keep:
        return []
    if m == keep:
        return list(range(m))

    pos = [i for i, r in enumerate(rewards) if r > 0]
    neg = [i for i, r in enumerate(rewards) if r <= 0]
    k_pos, k_neg = quotas(len(pos), len(neg), keep, min_pos=min_pos, min_neg=min_neg)

    if mode == "release":
        kept_pos = sorted(pos, key=lambda i: penalties[i])[:k_pos]  # sorted() is stable
        kept_neg = neg[:k_neg]
    else:
        if eps <= 0 or any(not penalties[i] >= 0 or math.isinf(penalties[i]) for i in pos):
            raise ValueError("paper mode needs eps > 0 and finite penalties >= 0")
        rng = rng if rng is not None else random.Random()
        weights = [1.0 / (penalties[i] + eps) for i in pos]
        kept_pos = _weighted_sample(pos, weights, k_pos, rng)
        kept_neg = rng.sample(neg, k_neg)
    return sorted(kept_pos + kept_neg)
