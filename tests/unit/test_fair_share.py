"""Fair share of a worker's queues: stride order by weight, no credit banked while idle."""

from __future__ import annotations

from collections import Counter

import pytest

from sandbox_service.fair_share import FairOrder


def serve_backlogged(order: FairOrder, jobs: int) -> Counter[str]:
    taken: Counter[str] = Counter()
    for _ in range(jobs):
        first = order.order()[0]
        order.served(first)
        taken[first] += 1
    return taken


def test_backlogged_queues_are_served_in_proportion_to_their_weights() -> None:
    taken = serve_backlogged(FairOrder({"a": 3.0, "b": 1.0, "c": 0.5}), 900)
    assert taken == {"a": 600, "b": 200, "c": 100}


def test_a_queue_back_from_idle_comes_first_once_then_takes_its_turn() -> None:
    order = FairOrder({"heavy": 1.0, "light": 1.0})
    for _ in range(1000):  # only the heavy tenant has work
        order.served("heavy")
    assert order.order()[0] == "light"  # its call arrives: served next
    order.served("light")
    taken = serve_backlogged(order, 100)  # now both backlogged: no banked credit
    assert abs(taken["light"] - taken["heavy"]) <= 2


def test_equal_weights_alternate_like_round_robin() -> None:
    order = FairOrder({"own": 1.0, "shared": 1.0})
    firsts = []
    for _ in range(4):
        first = order.order()[0]
        firsts.append(first)
        order.served(first)
    assert firsts == ["own", "shared", "own", "shared"]


def test_weights_must_be_positive() -> None:
    with pytest.raises(ValueError, match="weight"):
        FairOrder({"a": 0.0})
