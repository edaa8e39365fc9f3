"""The retry policy and the classification of answers: pure functions."""

from __future__ import annotations

import random

import pytest

from trainer_client.retry import (
    RetryPolicy,
    Verdict,
    classify_http_status,
    is_retryable_item_status,
    parse_retry_after,
)


@pytest.mark.parametrize(
    ("code", "verdict"),
    [
        (200, Verdict.ANSWERED),
        (429, Verdict.RETRY),
        (502, Verdict.RETRY),
        (503, Verdict.RETRY),
        (504, Verdict.RETRY),
        (422, Verdict.INVALID),
        (413, Verdict.INVALID),
        (400, Verdict.FATAL),
        (401, Verdict.FATAL),
        (403, Verdict.FATAL),
        (404, Verdict.FATAL),
        (500, Verdict.FATAL),
    ],
)
def test_http_status_verdicts(code: int, verdict: Verdict) -> None:
    assert classify_http_status(code) is verdict


@pytest.mark.parametrize("status", ["queue_timeout", "sandbox_error"])
def test_infrastructure_statuses_are_retried(status: str) -> None:
    assert is_retryable_item_status(status)


@pytest.mark.parametrize("status", ["ok", "error", "timeout", "memory_limit", "killed"])
def test_a_programs_own_statuses_are_never_retried(status: str) -> None:
    assert not is_retryable_item_status(status)


def test_retry_after_in_seconds_and_as_a_date() -> None:
    assert parse_retry_after("3", now_epoch_s=0) == 3.0
    assert parse_retry_after(" 1.5 ", now_epoch_s=0) == 1.5
    assert parse_retry_after("-4", now_epoch_s=0) == 0.0
    # 1 Jan 2030 00:00:10 GMT, ten seconds after "now".
    now = 1_893_456_000.0
    assert parse_retry_after("Tue, 01 Jan 2030 00:00:10 GMT", now_epoch_s=now) == 10.0
    assert parse_retry_after(None, now_epoch_s=0) is None
    assert parse_retry_after("soon", now_epoch_s=0) is None


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    policy = RetryPolicy(wait_initial_s=0.5, wait_max_s=3.0, wait_exp_base=2.0, wait_jitter_s=0)
    rng = random.Random(0)
    assert [policy.backoff_s(n, rng) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_stays_within_its_bound() -> None:
    policy = RetryPolicy(wait_initial_s=1.0, wait_max_s=100.0, wait_jitter_s=0.25)
    rng = random.Random(1)
    waits = [policy.backoff_s(1, rng) for _ in range(200)]
    assert all(1.0 <= w <= 1.25 for w in waits)
    assert len(set(waits)) > 100  # jitter spreads calls that failed together


def test_retry_after_is_a_floor_not_a_replacement() -> None:
    policy = RetryPolicy(wait_initial_s=2.0, wait_jitter_s=0)
    rng = random.Random(0)
    assert policy.wait_s(1, rng, retry_after_s=5.0) == 5.0
    assert policy.wait_s(1, rng, retry_after_s=0.5) == 2.0
    assert policy.wait_s(1, rng, retry_after_s=None) == 2.0


@pytest.mark.parametrize(
    "kwargs",
    [{"attempts": 0}, {"deadline_s": 0}, {"wait_initial_s": -1}, {"wait_exp_base": 0.5}],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
