"""Exceptions of the trainer client, all drawn here.

A program's own failure (exception, timeout, memory) is never an exception: it is an
`ExecuteResult` with a status. These are for calls that got no result:

    SandboxClientError                 base of everything below
    ├── InvalidRequestError            the request itself was rejected (local validation, 422, 413);
    │                                  never retried; batch-mates are unaffected
    ├── ClientClosedError              a call made on (or still waiting in) a closed client
    └── CallFailedError                the call got no result; `.call` names it
        ├── DeadlineExceededError      its total deadline passed (queued, retrying or in flight)
        ├── RetriesExhaustedError      every allowed attempt failed with a retryable error
        └── ServiceError               a non-retryable answer (401, 403, 500, ...)

Every error of one call carries a `CallInfo` naming that call, so a rollout log shows which tool
call of which session failed and why.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallInfo:
    """Names one client call in errors and logs."""

    call_id: int
    """Sequence number of the call within its client."""
    code_preview: str
    """The start of the program, for humans."""
    session_id: str | None = None
    """The session the call ran in, if any."""

    def __str__(self) -> str:
        session = f", session={self.session_id!r}" if self.session_id else ""
        return f"call #{self.call_id} (code={self.code_preview!r}{session})"


def code_preview(code: str, max_chars: int = 60) -> str:
    """The first line of `code`, shortened to `max_chars`."""
    first = code.strip().splitlines()[0] if code.strip() else ""
    return first if len(first) <= max_chars else first[: max_chars - 3] + "..."


class SandboxClientError(Exception):
    """Base class of every trainer client error."""


class InvalidRequestError(SandboxClientError):
    """The request was rejected as invalid; retrying it cannot help."""

    def __init__(self, message: str, call: CallInfo | None = None) -> None:
        self.call = call
        self.detail = message
        super().__init__(f"{call}: invalid request: {message}" if call else message)


class ClientClosedError(SandboxClientError):
    """The client was closed before the call could be answered."""


class CallFailedError(SandboxClientError):
    """A call got no result; `call`, `attempts` and `last_error` say which and why."""

    def __init__(self, call: CallInfo, reason: str, *, attempts: int, last_error: str) -> None:
        self.call = call
        self.attempts = attempts
        self.last_error = last_error
        detail = f"; last error: {last_error}" if last_error else ""
        super().__init__(f"{call} got no result: {reason} after {attempts} attempt(s){detail}")


class DeadlineExceededError(CallFailedError):
    """The call's total deadline passed before a result came back."""


class RetriesExhaustedError(CallFailedError):
    """The call failed with retryable errors as many times as the retry policy allows."""


class ServiceError(CallFailedError):
    """The service answered with a status that retrying cannot fix (auth, internal error)."""
