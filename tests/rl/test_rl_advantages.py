"""GRPO advantages over the kept group; numbers from the spec (shared/peers/rstar2-spec.md §3.4)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rl.advantages import group_advantages


def reference(rewards: list[float], group_ids: list[int], eps: float = 1e-6) -> list[float]:
    """Eq. 7 written out, one group at a time (VERL's singleton rule: mean 0, std 1)."""
    out = [0.0] * len(rewards)
    for group in set(group_ids):
        members = [i for i, g in enumerate(group_ids) if g == group]
        r = [rewards[i] for i in members]
        if len(r) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(r) / len(r)
            std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1))
        for i in members:
            out[i] = (rewards[i] - mean) / (std + eps)
    return out


def rewards(n_pos: int, n_neg: int) -> list[float]:
    return [1.0] * n_pos + [0.0] * n_neg


@pytest.mark.parametrize(
    ("n_pos", "n_neg", "a_pos", "a_neg"),
    [
        (6, 10, 1.25, -0.75),  # mean 0.375, unbiased std 0.5
        (2, 14, 2.5617, -0.3660),
        (15, 1, 0.25, -3.75),
        (1, 15, 3.75, -0.25),
        (8, 8, 0.9682, -0.9682),
    ],
)
def test_spec_examples(n_pos: int, n_neg: int, a_pos: float, a_neg: float) -> None:
    a = group_advantages(rewards(n_pos, n_neg))
    assert a.dtype == torch.float32 and a.shape == (n_pos + n_neg,)
    assert a[:n_pos].tolist() == pytest.approx([a_pos] * n_pos, abs=1e-4)
    assert a[n_pos:].tolist() == pytest.approx([a_neg] * n_neg, abs=1e-4)


def test_by_hand_with_the_epsilon() -> None:
    r = [1.0, 0.0, 0.0, 1.0, 1.0]
    mean = 0.6
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / 4)  # unbiased: n - 1
    expected = [(x - mean) / (std + 1e-6) for x in r]
    assert group_advantages(r).tolist() == pytest.approx(expected, rel=1e-6)


def test_equal_rewards_give_zero_and_singletons_follow_verl() -> None:
    assert group_advantages([1.0, 1.0, 1.0]).tolist() == [0.0, 0.0, 0.0]
    assert group_advantages([1.0]).tolist() == pytest.approx([1.0 / (1.0 + 1e-6)])
    assert group_advantages([]).numel() == 0
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(2, 2))


def test_many_groups_at_once_match_the_per_group_loop() -> None:
    rng = random.Random(0)
    values: list[float] = []
    ids: list[int] = []
    for group in rng.sample(range(1000), 12):
        size = rng.choice([1, 2, 4, 16])
        values += [float(rng.random() < 0.4) for _ in range(size)]
        ids += [group] * size
    order = list(range(len(values)))
    rng.shuffle(order)  # groups interleaved, as after a shuffle of the batch
    r = [values[i] for i in order]
    g = [ids[i] for i in order]
    got = group_advantages(torch.tensor(r, dtype=torch.float64), torch.tensor(g))
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(reference(r, g), rel=1e-9, abs=1e-12)
    assert group_advantages(r, g).tolist() == pytest.approx(reference(r, g), rel=1e-5, abs=1e-6)


def test_group_ids_must_match_the_rewards() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages([1.0, 0.0], [0])
