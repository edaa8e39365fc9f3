"""One chunk of a batched call (POST /verify, POST /grade/batch) with retries: a pure loop.

An HTTP failure that answered nothing (connection errors, 429, 502-504, a malformed 200)
re-sends the chunk; the members the service answered but could not finish (an infrastructure
status) are sent again alone, under the client's RetryPolicy: `attempts` failed attempts per
chunk at most, all within `deadline_s` of the call. A member still unfinished when its attempts
run out keeps that answer (the caller decides what it is worth); a chunk that never got an
answer raises.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from trainer_client.clock import Clock
from trainer_client.errors import (
    CallInfo,
    DeadlineExceededError,
    InvalidRequestError,
    RetriesExhaustedError,
    ServiceError,
)
from trainer_client.retry import RetryPolicy, Verdict

Member = TypeVar("Member")
Answer = TypeVar("Answer")


@dataclass(frozen=True, slots=True)
class ChunkOutcome(Generic[Answer]):
    """What became of one POST of a chunk: its answers in order, or why there are none."""

    verdict: Verdict
    results: Sequence[Answer] = ()
    cause: str = ""
    detail: str = ""
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Finished(Generic[Answer]):
    """How the loop reads an answer: whether it is final, and if not, why (for the error)."""

    final: Callable[[Answer], bool]
    why_not: Callable[[Answer], str]
    answers_noun: str
    """What the answers are called in an error ("verdicts", "results")..."""
    members_noun: str
    """...and what was sent ("items", "requests")."""


async def retry_chunk(
    send: Callable[[Sequence[Member]], Awaitable[ChunkOutcome[Answer]]],
    members: Sequence[Member],
    finished: Finished[Answer],
    *,
    retry: RetryPolicy,
    clock: Clock,
    rng: random.Random,
    info: CallInfo,
) -> list[Answer]:
    """The answers of `members`, in order, retried as the module doc says."""
    deadline = clock.now() + retry.deadline_s
    results: list[Answer | None] = [None] * len(members)
    pending = list(range(len(members)))
    failures = 0
    last_error = ""
    while True:
        # One attempt is bounded by the HTTP timeouts; the deadline is checked between attempts.
        outcome = await send([members[i] for i in pending])
        if outcome.verdict is Verdict.ANSWERED:
            if len(outcome.results) != len(pending):
                counts = f"{len(outcome.results)} {finished.answers_noun} for {len(pending)}"
                raise ServiceError(
                    info,
                    f"{counts} {finished.members_noun}",
                    attempts=failures + 1,
                    last_error="",
                )
            for index, result in zip(pending, outcome.results, strict=True):
                results[index] = result
            pending = [i for i in pending if not _final(results[i], finished)]
            if not pending:
                break
            last_error = next(finished.why_not(r) for r in (results[i] for i in pending) if r)
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
                break  # no time for another try: the unfinished answers stand
            raise DeadlineExceededError(
                info, "deadline exceeded", attempts=failures, last_error=last_error
            )
        await clock.sleep(wait_s)
    return [r for r in results if r is not None]


def _final(result: Answer | None, finished: Finished[Answer]) -> bool:
    return result is not None and finished.final(result)


def chunks(members: Sequence[Member], size: int) -> list[Sequence[Member]]:
    """Consecutive slices of at most `size` members."""
    return [members[i : i + size] for i in range(0, len(members), size)]
