"""Batched sealed grading (POST /grade/batch) with retries: the loop is pure, the POST is passed in.

Requests are sent in chunks of MAX_GRADES_PER_REQUEST, each retried by batch_retry: an HTTP
failure that graded nothing (connection errors, 429, 502-504, a malformed 200) re-sends the
chunk; a result with an infrastructure status (`queue_timeout`, `sandbox_error`, `cancelled`,
`deadline_exceeded`: reward null) is sent again alone, under the client's RetryPolicy, since a
grading is a pure function of its request. One still ungraded when the attempts run out keeps
its status (the caller decides what an ungraded candidate is worth; its reward stays null,
never 0).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from trainer_client.batch_retry import ChunkOutcome, Finished, retry_chunk
from trainer_client.clock import Clock
from trainer_client.errors import CallInfo
from trainer_client.grade_wire import AssertsTests, GradeRequest, GradeResult
from trainer_client.retry import RetryPolicy

GRADE_PATH = "/grade/batch"
MAX_GRADES_PER_REQUEST = 64
"""Requests of one POST: their cases run in parallel across the workers."""
ROUNDS_ALLOWANCE = 4
"""A chunk's read timeout, in case limits of its longest request: an asserts case runs the
evaluator and the candidate in turns (usually two or three limits' worth at most)."""


GradeOutcome = ChunkOutcome[GradeResult]
"""What became of one POST /grade/batch."""

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


_GRADED: Finished[GradeResult] = Finished(
    final=lambda result: result.status == "graded",
    why_not=lambda result: result.status,
    answers_noun="results",
    members_noun="requests",
)


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

    async def send_part(part: Sequence[GradeRequest]) -> GradeOutcome:
        return await send(part, budget_s(part))

    return await retry_chunk(
        send_part, requests, _GRADED, retry=retry, clock=clock, rng=rng, info=info
    )
