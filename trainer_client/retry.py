"""What is retried, and how long to wait: pure functions, no I/O.

Retried (the code never ran, or may be re-run safely):
    connection errors, timeouts and dropped connections (the whole batch),
    HTTP 429 (honouring Retry-After), 502, 503, 504 (the whole batch; nothing of it ran),
    per-item statuses `queue_timeout` and `sandbox_error` (only those items).
Never retried: a program's own statuses (ok, error, timeout, memory_limit, killed), 4xx other
than 429 (422/413 are split so that only the invalid item fails), and 500.
Returned, not retried, though safe to retry: `cancelled` (its group was cancelled, usually by
the trainer itself: re-sending would bring back the work the cancel removed) and
`deadline_exceeded` (the caller said the result is no longer wanted). Both are infrastructure
statuses (wire.INFRASTRUCTURE_STATUSES): the trainer leaves such a sample out of its loss.
"""

from __future__ import annotations

import email.utils
import enum
import random
from dataclasses import dataclass

from trainer_client.wire import Status

RETRYABLE_ITEM_STATUSES = frozenset({Status.QUEUE_TIMEOUT, Status.SANDBOX_ERROR})
"""Per-item statuses that mean the program did not (reliably) run: safe to submit again."""

RETRYABLE_HTTP_STATUSES = frozenset({429, 502, 503, 504})
"""Whole-batch answers that mean nothing of the batch ran."""


class Verdict(enum.Enum):
    """How the client treats one HTTP answer to a batch."""

    ANSWERED = "answered"
    """200: per-item results."""
    RETRY = "retry"
    """Nothing ran (or we cannot know): submit every item again after a backoff."""
    INVALID = "invalid"
    """The batch was rejected for its content: split it so only the bad item fails."""
    FATAL = "fatal"
    """Retrying cannot help: fail every item of the batch."""


def classify_http_status(status_code: int) -> Verdict:
    """The verdict for an HTTP status code of POST /execute/batch."""
    if status_code == 200:
        return Verdict.ANSWERED
    if status_code in RETRYABLE_HTTP_STATUSES:
        return Verdict.RETRY
    if status_code in (413, 422):
        return Verdict.INVALID
    return Verdict.FATAL


def is_retryable_item_status(status: str) -> bool:
    """True for the per-item statuses that are retried (the program did not reliably run)."""
    return status in RETRYABLE_ITEM_STATUSES


def parse_retry_after(value: str | None, *, now_epoch_s: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date); None if absent."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now_epoch_s)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounds and backoff of retries, per call (as in hynek/stamina)."""

    attempts: int = 10
    """Most retryable failures of one call; a 429 (back-pressure) uses none, only time."""
    deadline_s: float = 600.0
    """Total time one call may take, from `execute()` to its result, retries included."""
    wait_initial_s: float = 0.1
    """Backoff before the first retry."""
    wait_max_s: float = 5.0
    """Largest backoff between two attempts (Retry-After may ask for more)."""
    wait_exp_base: float = 2.0
    """Backoff growth per failed attempt."""
    wait_jitter_s: float = 0.5
    """Uniform random extra wait, so that calls failed together do not retry together."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.deadline_s <= 0:
            raise ValueError("deadline_s must be positive")
        if min(self.wait_initial_s, self.wait_max_s, self.wait_jitter_s) < 0:
            raise ValueError("waits must not be negative")
        if self.wait_exp_base < 1:
            raise ValueError("wait_exp_base must be at least 1")

    def backoff_s(self, failures: int, rng: random.Random) -> float:
        """Wait before the next attempt after `failures` (>= 1) failed ones, jitter included."""
        exponential = self.wait_initial_s * self.wait_exp_base ** (failures - 1)
        return min(self.wait_max_s, exponential + rng.uniform(0.0, self.wait_jitter_s))

    def wait_s(self, failures: int, rng: random.Random, retry_after_s: float | None) -> float:
        """The backoff, but never shorter than what the server asked for in Retry-After."""
        backoff = self.backoff_s(failures, rng)
        return backoff if retry_after_s is None else max(backoff, retry_after_s)
