"""The watchdog's rule table (sandbox_service/api/watchdog_rules.py), row by row."""

from __future__ import annotations

import pytest

from sandbox_service.api.watchdog_rules import (
    WITHDRAW_GRACE_S,
    Action,
    decide,
    next_check_every,
)

START_BY = 100.0


@pytest.mark.parametrize(
    ("kind", "has_result", "now", "attempt", "expected"),
    [
        ("done", True, 50.0, 1, Action.DELIVER),
        ("done", True, 500.0, 9, Action.DELIVER),  # a result wins over any deadline
        ("done", False, 50.0, 1, Action.WAIT),  # marked done, result not readable yet
        ("queued", False, START_BY, 1, Action.WAIT),
        ("queued", False, START_BY + WITHDRAW_GRACE_S, 1, Action.WAIT),  # grace not over
        ("queued", False, START_BY + WITHDRAW_GRACE_S + 0.01, 1, Action.WITHDRAW),
        ("running", False, START_BY + 1000, 1, Action.WAIT),  # its budget bounds it
        ("lost", False, 50.0, 1, Action.RETRY),
        ("lost", False, 50.0, 2, Action.FAIL),
        ("stranded", False, 50.0, 1, Action.REROUTE),
        ("stranded", False, START_BY + 1000, 3, Action.REROUTE),
    ],
)
def test_each_row_of_the_table(
    kind: str, has_result: bool, now: float, attempt: int, expected: Action
) -> None:
    assert decide(kind, has_result, now, START_BY, attempt, lost_job_retries=1) is expected


def test_no_retries_configured_fails_a_lost_job_at_once() -> None:
    assert decide("lost", False, 0.0, START_BY, 1, lost_job_retries=0) is Action.FAIL


def test_checks_back_off_by_doubling_up_to_the_cap() -> None:
    every = 1.0
    seen = []
    for _ in range(5):
        every = next_check_every(every, 4.0)
        seen.append(every)
    assert seen == [2.0, 4.0, 4.0, 4.0, 4.0]
