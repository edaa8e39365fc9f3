"""The HTTP edge: the only module that imports httpx. One POST /execute/batch -> BatchOutcome,
one POST /verify -> VerifyOutcome, one POST /grade/batch -> GradeOutcome."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from trainer_client.batch_retry import Answer, ChunkOutcome
from trainer_client.dispatch import BatchOutcome
from trainer_client.errors import InvalidRequestError, SandboxClientError
from trainer_client.grade import GRADE_PATH, GradeOutcome
from trainer_client.grade_wire import GradeBatchResponse, GradeRequest
from trainer_client.retry import Verdict, classify_http_status, parse_retry_after
from trainer_client.verify import VERIFY_PATH, VerifyOutcome
from trainer_client.wire import (
    BatchResponse,
    ForkResponse,
    GroupCancelled,
    VerifyItem,
    VerifyResponse,
)

BATCH_PATH = "/execute/batch"

# Failures after which nothing (or nothing we can know of) ran, so the batch is sent again.
# Not httpx.TransportError as a whole: UnsupportedProtocol, ProxyError or LocalProtocolError are
# mistakes of the caller's setup that no retry can fix.
_RETRYABLE_EXCEPTIONS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


@dataclass(frozen=True, slots=True)
class Timeouts:
    """HTTP timeouts of the client, in seconds.

    They nest outside the server's: program limit < job timeout < API wait (queue deadline + job
    timeout + margin) < the read timeout here, which is the largest program budget in the batch
    (a session cell's is at least the server's max_timeout) plus `response_margin_s`; the server
    checks its side at start-up against the same margin (Settings.client_response_margin_s).
    The call's total deadline (RetryPolicy.deadline_s) bounds everything, retries included.
    """

    connect_s: float = 5.0
    """Opening a TCP connection."""
    write_s: float = 30.0
    """Sending one request body."""
    pool_s: float = 30.0
    """Waiting for a free pooled connection."""
    response_margin_s: float = 120.0
    """Read timeout beyond the batch's largest program timeout; above the server's API wait."""

    def __post_init__(self) -> None:
        if min(self.connect_s, self.write_s, self.pool_s, self.response_margin_s) <= 0:
            raise ValueError("timeouts must be positive")

    def for_batch(self, largest_timeout_s: float) -> httpx.Timeout:
        """The httpx timeouts of one batch whose slowest program may run `largest_timeout_s`."""
        return httpx.Timeout(
            connect=self.connect_s,
            read=largest_timeout_s + self.response_margin_s,
            write=self.write_s,
            pool=self.pool_s,
        )


def encode_batch(payloads: Sequence[bytes]) -> bytes:
    """The JSON body of a BatchRequest from already encoded ExecuteRequests."""
    return b'{"requests":[' + b",".join(payloads) + b"]}"


def error_detail(body: bytes, fallback: str) -> str:
    """The message of an error body: FastAPI's `detail` as "field: message; ...", else the text.

    A batch item's location (`body.requests.3.timeout`) is shortened to its field: after the
    client splits a rejected batch, the index is that of a sub-batch and would mislead.
    """
    text = body.decode("utf-8", "replace").strip()
    try:
        detail = json.loads(text)["detail"]
    except (ValueError, KeyError, TypeError):
        return text[:2000] or fallback
    if isinstance(detail, str):
        return detail[:2000]
    if isinstance(detail, list) and all(isinstance(d, dict) for d in detail):
        parts = []
        for problem in detail:
            loc = [str(p) for p in problem.get("loc", []) if p not in ("body", "requests")]
            loc = [p for p in loc if not p.isdigit()]
            where = ".".join(loc)
            message = str(problem.get("msg", problem))
            parts.append(f"{where}: {message}" if where else message)
        return "; ".join(parts)[:2000]
    return text[:2000]


async def post_batch(
    http: httpx.AsyncClient, payloads: Sequence[bytes], largest_timeout_s: float, timeouts: Timeouts
) -> BatchOutcome:
    """Send one batch; every failure comes back as an outcome, never as an exception."""
    try:
        response = await http.post(
            BATCH_PATH,
            content=encode_batch(payloads),
            headers={"content-type": "application/json"},
            timeout=timeouts.for_batch(largest_timeout_s),
        )
    except _RETRYABLE_EXCEPTIONS as exc:
        return BatchOutcome(Verdict.RETRY, cause=type(exc).__name__, detail=str(exc) or repr(exc))
    except httpx.HTTPError as exc:
        return BatchOutcome(Verdict.FATAL, cause=type(exc).__name__, detail=str(exc) or repr(exc))

    verdict = classify_http_status(response.status_code)
    cause = str(response.status_code)
    if verdict is not Verdict.ANSWERED:
        retry_after_s = parse_retry_after(
            response.headers.get("retry-after"), now_epoch_s=time.time()
        )
        return BatchOutcome(
            verdict,
            cause=cause,
            detail=error_detail(response.content, response.reason_phrase),
            retry_after_s=retry_after_s,
        )
    try:
        parsed = BatchResponse.model_validate_json(response.content)
    except ValidationError as exc:
        # A 200 that is not our schema: a proxy or a half-written body. Nothing says it ran.
        return BatchOutcome(Verdict.RETRY, cause="malformed", detail=str(exc)[:2000])
    return BatchOutcome(Verdict.ANSWERED, results=parsed.results)


async def delete_session(http: httpx.AsyncClient, session_id: str, timeouts: Timeouts) -> bool:
    """DELETE /sessions/{id}: True when the session was ended, False when it did not exist."""
    response = await http.delete(
        f"/sessions/{quote(session_id, safe='')}", timeout=timeouts.for_batch(0.0)
    )
    if response.status_code == 404:
        return False
    if response.status_code not in (200, 204):
        raise SandboxClientError(
            f"ending session {session_id!r}: HTTP {response.status_code}: "
            + error_detail(response.content, response.reason_phrase)
        )
    return True


async def post_fork(
    http: httpx.AsyncClient, session_id: str, n: int, timeouts: Timeouts
) -> list[str]:
    """POST /sessions/{id}/fork: the ids of the n new sessions. Never retried: a fork that
    answered nothing may have made forks (they expire with the server's TTL)."""
    response = await http.post(
        f"/sessions/{quote(session_id, safe='')}/fork",
        json={"n": n},
        timeout=timeouts.for_batch(0.0),
    )
    detail = error_detail(response.content, response.reason_phrase)
    if response.status_code == 422:
        raise InvalidRequestError(f"forking session {session_id!r}: {detail}")
    if response.status_code != 200:
        raise SandboxClientError(
            f"forking session {session_id!r}: HTTP {response.status_code}: {detail}"
        )
    try:
        return ForkResponse.model_validate_json(response.content).session_ids
    except ValidationError as exc:
        raise SandboxClientError(f"forking session {session_id!r}: bad answer: {exc}") from exc


async def post_cancel_group(
    http: httpx.AsyncClient, group: str, timeouts: Timeouts
) -> GroupCancelled | None:
    """POST /groups/{group}/cancel: what was cancelled, or None when the group is unknown."""
    try:
        response = await http.post(
            f"/groups/{quote(group, safe='/:')}/cancel", timeout=timeouts.for_batch(0.0)
        )
    except httpx.HTTPError as exc:
        raise SandboxClientError(f"cancelling group {group!r}: {exc!r}") from exc
    if response.status_code == 404:
        return None
    if response.status_code != 200:
        raise SandboxClientError(
            f"cancelling group {group!r}: HTTP {response.status_code}: "
            + error_detail(response.content, response.reason_phrase)
        )
    return GroupCancelled.model_validate_json(response.content)


async def post_grades(
    http: httpx.AsyncClient,
    requests: Sequence[GradeRequest],
    budget_s: float,
    timeouts: Timeouts,
) -> GradeOutcome:
    """One POST /grade/batch; every failure comes back as an outcome, never as an exception."""
    body = {"requests": [r.model_dump(mode="json", exclude_none=True) for r in requests]}
    return await _post_chunk(
        http,
        GRADE_PATH,
        body,
        timeouts.for_batch(budget_s),
        lambda content: GradeBatchResponse.model_validate_json(content).results,
    )


async def post_verify(
    http: httpx.AsyncClient,
    items: Sequence[VerifyItem],
    timeout_s: float,
    rel_tol: float,
    budget_s: float,
    timeouts: Timeouts,
) -> VerifyOutcome:
    """One POST /verify; every failure comes back as an outcome, never as an exception."""
    body = {"items": [i.model_dump() for i in items], "timeout": timeout_s, "rel_tol": rel_tol}
    return await _post_chunk(
        http,
        VERIFY_PATH,
        body,
        timeouts.for_batch(budget_s),
        lambda content: VerifyResponse.model_validate_json(content).results,
    )


async def _post_chunk(
    http: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    timeout: httpx.Timeout,
    parse: Callable[[bytes], Sequence[Answer]],
) -> ChunkOutcome[Answer]:
    """One POST of a batched call's chunk: its answers, or why there are none."""
    try:
        response = await http.post(path, json=body, timeout=timeout)
    except _RETRYABLE_EXCEPTIONS as exc:
        return ChunkOutcome(Verdict.RETRY, cause=type(exc).__name__, detail=str(exc) or repr(exc))
    except httpx.HTTPError as exc:
        return ChunkOutcome(Verdict.FATAL, cause=type(exc).__name__, detail=str(exc) or repr(exc))
    verdict = classify_http_status(response.status_code)
    if verdict is not Verdict.ANSWERED:
        return ChunkOutcome(
            verdict,
            cause=str(response.status_code),
            detail=error_detail(response.content, response.reason_phrase),
            retry_after_s=parse_retry_after(
                response.headers.get("retry-after"), now_epoch_s=time.time()
            ),
        )
    try:
        results = parse(response.content)
    except ValidationError as exc:
        return ChunkOutcome(Verdict.RETRY, cause="malformed", detail=str(exc)[:2000])
    return ChunkOutcome(Verdict.ANSWERED, results=results)
