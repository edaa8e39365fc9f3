"""When a worker delivers a chunk's results (broker/outbox.py): a few at a time, never late."""

from __future__ import annotations

import pytest

from sandbox_service.broker.outbox import FLUSH_AFTER_S, FLUSH_BYTES, Delivery, Outbox


def delivery(n: int, size: int = 10) -> Delivery:
    return Delivery(f"job.{n}", "x" * size, "", "")


def test_short_calls_wait_for_each_other_until_the_oldest_has_waited_long_enough() -> None:
    outbox = Outbox()
    outbox.add(delivery(1), now=100.0)
    assert not outbox.due(now=100.001, ran_s=0.001, first=False, last=False)
    outbox.add(delivery(2), now=100.002)
    assert not outbox.due(now=100.002, ran_s=0.001, first=False, last=False)
    assert outbox.due(now=100.001 + FLUSH_AFTER_S, ran_s=0.001, first=False, last=False)
    assert [d.execution_id for d in outbox.take()] == ["job.1", "job.2"]
    assert outbox.take() == []


@pytest.mark.parametrize(
    ("ran_s", "first", "last"),
    [(0.0, True, False), (0.0, False, True), (FLUSH_AFTER_S, False, False)],
    ids=["the chunk's first call", "its last call", "a call that was not short"],
)
def test_these_are_delivered_at_once(ran_s: float, first: bool, last: bool) -> None:
    outbox = Outbox()
    outbox.add(delivery(0), now=5.0)
    assert outbox.due(now=5.0, ran_s=ran_s, first=first, last=last)


def test_large_results_are_delivered_whatever_their_age() -> None:
    outbox = Outbox()
    outbox.add(delivery(0, size=FLUSH_BYTES // 2), now=1.0)
    assert not outbox.due(now=1.0, ran_s=0.0, first=False, last=False)
    outbox.add(delivery(1, size=FLUSH_BYTES // 2), now=1.0)
    assert outbox.due(now=1.0, ran_s=0.0, first=False, last=False)


def test_the_age_counts_from_the_oldest_result_kept_since_the_last_delivery() -> None:
    outbox = Outbox()
    outbox.add(delivery(0), now=1.0)
    outbox.take()
    outbox.add(delivery(1), now=9.0)
    assert not outbox.due(now=9.0 + FLUSH_AFTER_S / 2, ran_s=0.0, first=False, last=False)
