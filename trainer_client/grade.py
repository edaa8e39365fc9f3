"""Batched sealed grading (POST /grade/batch) with retries: the loop is pure, the POST is passed in.

Requests are sent in chunks of MAX_GRADES_PER_REQUEST. An HTTP failure that graded nothing
(connection errors, 429, 502-504, a malformed 200) re-sends the chunk; a result with an
infrastructure status (`queue_timeout`, `sandbox_error`, `cancelled`, `deadline_exceeded`:
reward null) is sent again alone, under the client's RetryPolicy, since a grading is a pure
function of its request. One still ungraded when the attempts run out keeps its status (the
caller decides what an ungraded candidate is worth; its reward stays null, never 0).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from trainer_client.clock import Clock
from trainer_client.errors import (
    CallInfo,
    DeadlineExceededError,
    InvalidRequestError,
    RetriesExhaustedError,
    ServiceError,
)
from trainer_client.grade_wire import AssertsTests, GradeRequest, GradeResult
from trainer_client.retry import RetryPolicy, Verdict

GRADE_PATH = "/grade/batch"
MAX_GRADES_PER_REQUEST = 64
"""Requests of one POST: their cases run in parallel across the workers."""
ROUNDS_ALLOWANCE = 4
"""A chunk's read timeout, in case limits of its longest request: an asserts case runs the
evaluator and the candidate in turns (usually two or three limits' worth at most)."""


@dataclass(frozen=True, slots=True)
class GradeOutcome:
    """What became of one POST /grade/batch."""

    verdict: Verdict
    results: Sequence[GradeResult] = ()
    cause: str = ""
    detail: str = ""
    retry_after_s: float | None = None


SendGrades = Callable[[Sequence[GradeRequest], float], Awaitable[GradeOutcome]]
"""send(requests, the longest the chunk may take in s)."""


def to_grade_request(request: GradeRequest | dict[str, Any]) -> GradeRequest:
    """A GradeRequest from itself or from its JSON fields (validated here, before sending)."""
    return request if isinstance(request, GradeRequest) else GradeRequest.model_validate(request)


def budget_s(requests: Sequence[GradeRequest]) -> float:
    """The longest a chunk of requests may take on the server (read-timeout sizing)."""
    longest = 0.0
    for request in requests:
        tests = request.tests
        rounds = ROUNDS_ALLOWANCE * (2 if isinstance(tests, AssertsTests) else 1)
        longest = max(longest, request.timeout * rounds)
    return longest


def graded(result: GradeResult | None) -> bool:
    """Whether the service graded it (reward set), as opposed to failing to."""
    return result is not None and result.status == "graded"


async def grade_chunk(
    send: SendGrades,
    requests: Sequence[GradeRequest],
    *,
    retry: RetryPolicy,
    clock: Clock,
    rng: random.Random,
    info: CallInfo,
) -> list[GradeResult]:
    """Results of `requests` (at most MAX_GRADES_PER_REQUEST), retried as the module says."""
    deadline = clock.now() + retry.deadline_s
    results: list[GradeResult | None] = [None] * len(requests)
    pending = list(range(len(requests)))
    failures = 0
    last_error = ""
    while True:
        part = [requests[i] for i in pending]
        outcome = await send(part, budget_s(part))
        if outcome.verdict is Verdict.ANSWERED:
            if len(outcome.results) != len(pending):
                raise ServiceError(
                    info,
                    f"{len(outcome.results)} results for {len(pending)} requests",
                    attempts=failures + 1,
                    last_error="",
                )
            for index, result in zip(pending, outcome.results, strict=True):
                results[index] = result
            pending = [i for i in pending if not graded(results[i])]
            if not pending:
                break
            last_error = next(r.status for r in (results[i] for i in pending) if r)
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
        wait_s = retry.wait_s(max(failures, 1), rng, outcome.retry_after_s)
        if clock.now() + wait_s >= deadline:
            if all(results[i] is not None for i in pending):
                break  # no time for another try: the ungraded statuses stand
            raise DeadlineExceededError(
                info, "deadline exceeded", attempts=failures, last_error=last_error
            )
        await clock.sleep(wait_s)
    return [r for r in results if r is not None]


def chunks(requests: Sequence[GradeRequest], size: int) -> list[Sequence[GradeRequest]]:
    """Consecutive slices of at most `size` requests."""
    return [requests[i : i + size] for i in range(0, len(requests), size)]
