"""Batched answer verification (POST /verify) with retries: the loop is pure, the POST is passed in.

A request's items are sent in chunks (the server bounds a request's size); an HTTP failure that
ran nothing (connection errors, 429, 502-504, a malformed 200) re-sends the whole chunk, and the
items answered `queue_timeout` or `sandbox_error` (not judged) are sent again alone, under the
client's RetryPolicy: `attempts` failed attempts per chunk at most, all within `deadline_s` of the
call. An item still not judged when its attempts run out keeps that verdict (the caller decides
what an unjudged answer is worth); a chunk that never got an answer raises.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from trainer_client.clock import Clock
from trainer_client.errors import (
    CallInfo,
    DeadlineExceededError,
    InvalidRequestError,
    RetriesExhaustedError,
    ServiceError,
)
from trainer_client.retry import RetryPolicy, Verdict
from trainer_client.wire import (
    VERIFY_MAX_ITEMS_PER_JOB,
    VerifyItem,
    VerifyResult,
    verify_job_timeout_s,
)

VERIFY_PATH = "/verify"
MAX_ITEMS_PER_REQUEST = 256
"""Items of one POST: several of the server's jobs (32 items each), far under its bound."""


@dataclass(frozen=True, slots=True)
class VerifyOutcome:
    """What became of one POST /verify."""

    verdict: Verdict
    results: Sequence[VerifyResult] = ()
    cause: str = ""
    detail: str = ""
    retry_after_s: float | None = None


SendVerify = Callable[[Sequence[VerifyItem], float, float, float], Awaitable[VerifyOutcome]]
"""send(items, per-item timeout s, rel_tol, the longest one job may run in s)."""


def job_budget_s(items: int, timeout_s: float) -> float:
    """The longest the server's slowest job for `items` items may run (read-timeout sizing)."""
    return verify_job_timeout_s(min(items, VERIFY_MAX_ITEMS_PER_JOB), timeout_s)


async def verify_chunk(
    send: SendVerify,
    items: Sequence[VerifyItem],
    *,
    timeout_s: float,
    rel_tol: float,
    retry: RetryPolicy,
    clock: Clock,
    rng: random.Random,
    info: CallInfo,
) -> list[VerifyResult]:
    """Verdicts of `items` (at most MAX_ITEMS_PER_REQUEST), retried as the module doc says."""
    deadline = clock.now() + retry.deadline_s
    results: list[VerifyResult | None] = [None] * len(items)
    pending = list(range(len(items)))
    failures = 0
    last_error = ""
    while True:
        budget_s = job_budget_s(len(pending), timeout_s)
        # One attempt is bounded by the HTTP timeouts; the deadline is checked between attempts.
        outcome = await send([items[i] for i in pending], timeout_s, rel_tol, budget_s)
        retry_after_s = outcome.retry_after_s
        if outcome.verdict is Verdict.ANSWERED:
            if len(outcome.results) != len(pending):
                raise ServiceError(
                    info,
                    f"{len(outcome.results)} verdicts for {len(pending)} items",
                    attempts=failures + 1,
                    last_error="",
                )
            for index, result in zip(pending, outcome.results, strict=True):
                results[index] = result
            pending = [i for i in pending if not _judged(results[i])]
            if not pending:
                break
            last_error = next(f"{r.reason}: {r.detail}" for r in (results[i] for i in pending) if r)
            failures += 1
        elif outcome.verdict is Verdict.INVALID:
            raise InvalidRequestError(outcome.detail, info)
        elif outcome.verdict is Verdict.FATAL:
            raise ServiceError(
                info, f"HTTP {outcome.cause}", attempts=failures + 1, last_error=outcome.detail
            )
        else:
            last_error = f"{outcome.cause}: {outcome.detail}"
            if outcome.cause != "429":  # back-pressure costs time, not attempts
                failures += 1
        if failures >= retry.attempts:
            if any(results[i] is None for i in pending):
                raise RetriesExhaustedError(
                    info, "retries exhausted", attempts=failures, last_error=last_error
                )
            break
        wait_s = retry.wait_s(max(failures, 1), rng, retry_after_s)
        if clock.now() + wait_s >= deadline:
            if all(results[i] is not None for i in pending):
                break  # no time for another try: the unjudged verdicts stand
            raise DeadlineExceededError(
                info, "deadline exceeded", attempts=failures, last_error=last_error
            )
        await clock.sleep(wait_s)
    return [r for r in results if r is not None]


def _judged(result: VerifyResult | None) -> bool:
    return result is not None and result.judged


def chunks(items: Sequence[VerifyItem], size: int) -> list[Sequence[VerifyItem]]:
    """Consecutive slices of at most `size` items."""
    return [items[i : i + size] for i in range(0, len(items), size)]
