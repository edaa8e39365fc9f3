"""Batched answer verification (POST /verify) with retries: the loop is pure, the POST is passed in.

A request's items are sent in chunks (the server bounds a request's size), each retried by
batch_retry: an HTTP failure that ran nothing (connection errors, 429, 502-504, a malformed 200)
re-sends the whole chunk, and the items answered `queue_timeout` or `sandbox_error` (not judged)
are sent again alone, under the client's RetryPolicy: `attempts` failed attempts per chunk at
most, all within `deadline_s` of the call. An item still not judged when its attempts run out
keeps that verdict (the caller decides what an unjudged answer is worth); a chunk that never got
an answer raises.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence

from trainer_client.batch_retry import ChunkOutcome, Finished, retry_chunk
from trainer_client.clock import Clock
from trainer_client.errors import CallInfo
from trainer_client.retry import RetryPolicy
from trainer_client.wire import (
    VERIFY_MAX_ITEMS_PER_JOB,
    VerifyItem,
    VerifyResult,
    verify_job_timeout_s,
)

VERIFY_PATH = "/verify"
MAX_ITEMS_PER_REQUEST = 256
"""Items of one POST: several of the server's jobs (32 items each), far under its bound."""


VerifyOutcome = ChunkOutcome[VerifyResult]
"""What became of one POST /verify."""

SendVerify = Callable[[Sequence[VerifyItem], float, float, float], Awaitable[VerifyOutcome]]
"""send(items, per-item timeout s, rel_tol, the longest one job may run in s)."""


def job_budget_s(items: int, timeout_s: float) -> float:
    """The longest the server's slowest job for `items` items may run (read-timeout sizing)."""
    return verify_job_timeout_s(min(items, VERIFY_MAX_ITEMS_PER_JOB), timeout_s)


_JUDGED: Finished[VerifyResult] = Finished(
    final=lambda result: result.judged,
    why_not=lambda result: f"{result.reason}: {result.detail}",
    answers_noun="verdicts",
    members_noun="items",
)


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

    async def send_part(part: Sequence[VerifyItem]) -> VerifyOutcome:
        return await send(part, timeout_s, rel_tol, job_budget_s(len(part), timeout_s))

    return await retry_chunk(
        send_part, items, _JUDGED, retry=retry, clock=clock, rng=rng, info=info
    )
