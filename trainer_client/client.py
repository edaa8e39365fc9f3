"""SandboxClient: the async client an RL trainer embeds to run tool calls in rl-sandbox."""

from __future__ import annotations

import asyncio
import base64
import os
import random
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

import httpx
from pydantic import ValidationError

from trainer_client.batch_retry import chunks
from trainer_client.clock import Clock, LoopClock
from trainer_client.dispatch import BatchOutcome, DispatchConfig, Dispatcher
from trainer_client.errors import CallInfo, InvalidRequestError
from trainer_client.grade import (
    MAX_GRADES_PER_REQUEST,
    GradeOutcome,
    grade_chunk,
    to_grade_request,
)
from trainer_client.grade_wire import GradeRequest, GradeResult
from trainer_client.group import Group
from trainer_client.http import (
    Timeouts,
    delete_session,
    post_batch,
    post_cancel_group,
    post_fork,
    post_grades,
    post_verify,
)
from trainer_client.retry import RetryPolicy
from trainer_client.session import Session, new_session_id
from trainer_client.stats import ClientStats, Counters
from trainer_client.verify import MAX_ITEMS_PER_REQUEST, VerifyOutcome, verify_chunk
from trainer_client.wire import (
    ExecuteRequest,
    ExecuteResult,
    GroupCancelled,
    VerifyItem,
    VerifyResult,
)

if TYPE_CHECKING:
    import sys

    # typing.Self is 3.11+; the client supports 3.10 (annotations are never evaluated).
    if sys.version_info >= (3, 11):
        from typing import Self
    else:
        from typing_extensions import Self

_INHERITED: list[tuple[httpx.AsyncClient, Dispatcher]] = []
"""The pools and batching loops a forked child inherited: kept, never used (see _own_process)."""

RequestLike = ExecuteRequest | Mapping[str, Any]
"""An ExecuteRequest, or a mapping of its fields (wire format: `files` values are base64)."""


def build_request(
    code: str,
    *,
    stdin: str = "",
    timeout: float = 10.0,
    memory_mb: int | None = None,
    session_id: str | None = None,
    files: Mapping[str, bytes] | None = None,
    fetch_files: Sequence[str] | None = None,
    seed: int | None = None,
    group: str | None = None,
    deadline_s: float | None = None,
) -> ExecuteRequest:
    """An ExecuteRequest from execute()'s arguments; unset options keep the server's defaults."""
    fields: dict[str, Any] = {"code": code, "timeout": timeout}
    if stdin:
        fields["stdin"] = stdin
    if memory_mb is not None:
        fields["memory_mb"] = memory_mb
    if session_id is not None:
        fields["session_id"] = session_id
    if files:
        fields["files"] = {path: base64.b64encode(data).decode() for path, data in files.items()}
    if fetch_files:
        fields["fetch_files"] = list(fetch_files)
    if seed is not None:
        fields["seed"] = seed
    if group is not None:
        fields["group"] = group
    if deadline_s is not None:
        fields["deadline_s"] = deadline_s
    return to_request(fields)


def to_request(request: RequestLike) -> ExecuteRequest:
    """Validate locally what the client can (unknown fields, language, paths, base64)."""
    if isinstance(request, ExecuteRequest):
        return request
    try:
        return ExecuteRequest.model_validate(dict(request))
    except ValidationError as exc:
        raise InvalidRequestError(str(exc)) from exc


class SandboxClient:
    """Async client of rl-sandbox: concurrent calls are micro-batched into POST /execute/batch.

    Use it as `async with SandboxClient(url) as client: result = await client.execute(code)`.
    Every call ends with its ExecuteResult or a SandboxClientError naming it (see errors.py);
    a program's own failure is a result status, not an exception.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        max_batch_size: int = 64,
        max_wait_s: float = 0.005,
        max_concurrency: int = 16,
        timeouts: Timeouts | None = None,
        retry: RetryPolicy | None = None,
        server_max_timeout_s: float = 60.0,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """Options as in the class docs; `clock=VirtualClock()` is the test mode (never sleeps)."""
        self._timeouts = timeouts or Timeouts()
        self._config = DispatchConfig(
            max_batch_size=max_batch_size,
            max_wait_s=max_wait_s,
            max_concurrency=max_concurrency,
            retry=retry or RetryPolicy(),
            server_max_timeout_s=server_max_timeout_s,
        )
        self._base_url = base_url
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._transport = transport
        self._clock = clock or LoopClock()
        self._rng = rng or random.Random()
        self._verify_calls = 0
        self._build()

    def _build(self) -> None:
        """The connection pool and the batching loop of this process."""
        self._pid = os.getpid()
        # One pooled keep-alive connection per in-flight batch: no connect per request.
        limit = self._config.max_concurrency
        self._http = httpx.AsyncClient(
            base_url=self._base_url,
            headers=self._headers,
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
            transport=self._transport,
        )
        self._counters = Counters()
        self._dispatcher = Dispatcher(
            self._send, self._config, self._clock, self._counters, self._rng
        )

    def _own_process(self) -> None:
        """After os.fork, the child builds its own pool and batching loop.

        The parent's pooled sockets are the parent's connections (a child reading from one
        would take the parent's answers), and its batching loop is a task of an event loop that
        does not run in the child: calls queued there would wait until their deadline. The
        inherited objects are kept, never used or closed: closing them could act on the
        parent's connections (and needs the parent's loop); the child's copies of those sockets
        close when it exits.
        """
        if os.getpid() != self._pid:
            _INHERITED.append((self._http, self._dispatcher))
            self._build()

    async def _send(self, payloads: Sequence[bytes], largest_timeout_s: float) -> BatchOutcome:
        return await post_batch(self._http, payloads, largest_timeout_s, self._timeouts)

    async def __aenter__(self) -> Self:
        self._own_process()
        self._dispatcher.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose(cancel=exc is not None)

    async def aclose(self, *, cancel: bool = False) -> None:
        """Wait for outstanding calls (or fail them at once with `cancel`), then close the pool."""
        self._own_process()
        try:
            await self._dispatcher.aclose(cancel=cancel)
        finally:
            await self._http.aclose()

    async def execute(
        self,
        code: str,
        *,
        stdin: str = "",
        # The program's wall-clock limit, named as the API field; not a limit on this await.
        timeout: float = 10.0,
        memory_mb: int | None = None,
        session_id: str | None = None,
        files: Mapping[str, bytes] | None = None,
        fetch_files: Sequence[str] | None = None,
        seed: int | None = None,
        group: str | None = None,
        deadline_s: float | None = None,
    ) -> ExecuteResult:
        """Run one program; `files` are raw bytes (sent base64), `timeout` is in seconds.

        `seed` seeds the jail's random generators (same program and seed: same output);
        `group` labels the call (see `group()`); `deadline_s`: seconds after which the service
        stops it or never starts it (`deadline_exceeded`)."""
        request = build_request(
            code,
            stdin=stdin,
            timeout=timeout,
            memory_mb=memory_mb,
            session_id=session_id,
            files=files,
            fetch_files=fetch_files,
            seed=seed,
            group=group,
            deadline_s=deadline_s,
        )
        self._own_process()
        return await self._dispatcher.submit(request)

    @overload
    async def execute_many(
        self, requests: Iterable[RequestLike], *, return_exceptions: Literal[False] = False
    ) -> list[ExecuteResult]: ...

    @overload
    async def execute_many(
        self, requests: Iterable[RequestLike], *, return_exceptions: Literal[True]
    ) -> list[ExecuteResult | BaseException]: ...

    async def execute_many(
        self, requests: Iterable[RequestLike], *, return_exceptions: bool = False
    ) -> list[ExecuteResult] | list[ExecuteResult | BaseException]:
        """Run many programs concurrently; results in request order.

        With `return_exceptions`, a call that failed has its exception in its place; otherwise
        the first failure is raised and the calls still waiting are cancelled.
        """
        tasks = [asyncio.ensure_future(self._submit(r)) for r in requests]
        if return_exceptions:
            return await asyncio.gather(*tasks, return_exceptions=True)
        try:
            return await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _submit(self, request: RequestLike) -> ExecuteResult:
        checked = to_request(request)
        self._own_process()
        return await self._dispatcher.submit(checked)

    async def end_session(self, session_id: str) -> bool:
        """End a session (DELETE /sessions/{id}); False if the server did not know it."""
        self._own_process()
        return await delete_session(self._http, session_id, self._timeouts)

    async def fork_session(self, session_id: str, n: int) -> list[str]:
        """POST /sessions/{id}/fork: the ids of `n` new sessions, each a copy of the session's
        state after its cells so far (never retried)."""
        self._own_process()
        return await post_fork(self._http, session_id, n, self._timeouts)

    def session(
        self, session_id: str | None = None, *, timeout: float = 10.0, group: str | None = None
    ) -> Session:
        """A session object (`async with client.session() as s: await s.run(code)`).

        A new id unless `session_id` names one; the block's end ends the session. `timeout` is
        each cell's default limit in seconds; every cell carries `group` (cancelling the group
        ends the session).
        """
        return Session(self, session_id or new_session_id(), timeout=timeout, group=group)

    async def cancel_group(self, group: str) -> GroupCancelled | None:
        """Cancel every queued and running call of `group` and end its sessions (POST
        /groups/{group}/cancel); None when the service knows no such group for this key.

        The cancelled calls answer status `cancelled`; the client does not send them again.
        """
        self._own_process()
        return await post_cancel_group(self._http, group, self._timeouts)

    def group(self, group: str) -> Group:
        """A group scope (`async with client.group("step3/p17") as g: await g.execute(code)`):
        every call and session made through it carries `group`, and the whole group is
        cancelled when the block exits with an exception (task cancellation included)."""
        return Group(self, group)

    async def verify(
        self,
        items: Sequence[VerifyItem | tuple[str, str]],
        *,
        timeout: float = 5.0,
        rel_tol: float = 1e-6,
    ) -> list[VerifyResult]:
        """Judge (answer, reference) pairs on the service (POST /verify); verdicts in order.

        `timeout` is each item's check limit in seconds. Items the service could not judge
        (`queue_timeout`, `sandbox_error`) are sent again under the retry policy; one still
        unjudged when it runs out keeps that verdict (`VerifyResult.judged` is False).
        """
        batch = [
            i if isinstance(i, VerifyItem) else VerifyItem(answer=i[0], reference=i[1])
            for i in items
        ]
        if not batch:
            return []
        self._own_process()
        self._verify_calls += 1
        info = CallInfo(self._verify_calls, f"verify {len(batch)} answer(s)")

        async def send(
            part: Sequence[VerifyItem], timeout_s: float, tol: float, budget_s: float
        ) -> VerifyOutcome:
            return await post_verify(self._http, part, timeout_s, tol, budget_s, self._timeouts)

        parts = await asyncio.gather(
            *(
                verify_chunk(
                    send,
                    part,
                    timeout_s=timeout,
                    rel_tol=rel_tol,
                    retry=self._config.retry,
                    clock=self._clock,
                    rng=self._rng,
                    info=info,
                )
                for part in chunks(batch, MAX_ITEMS_PER_REQUEST)
            )
        )
        return [result for part in parts for result in part]

    async def grade(self, requests: Sequence[GradeRequest | dict[str, Any]]) -> list[GradeResult]:
        """Grade candidates on the service (POST /grade/batch); results in order.

        Each request is a GradeRequest or its JSON fields (`code`, `tests`, ...: the spec's
        "Sealed grading"). A result the service could not grade (an infrastructure status,
        reward null) is sent again under the retry policy; one still ungraded when it runs out
        keeps that status.
        """
        batch = [to_grade_request(r) for r in requests]
        if not batch:
            return []
        self._own_process()
        self._verify_calls += 1
        info = CallInfo(self._verify_calls, f"grade {len(batch)} candidate(s)")

        async def send(part: Sequence[GradeRequest], budget_s: float) -> GradeOutcome:
            return await post_grades(self._http, part, budget_s, self._timeouts)

        parts = await asyncio.gather(
            *(
                grade_chunk(
                    send,
                    part,
                    retry=self._config.retry,
                    clock=self._clock,
                    rng=self._rng,
                    info=info,
                )
                for part in chunks(batch, MAX_GRADES_PER_REQUEST)
            )
        )
        return [result for part in parts for result in part]

    def stats(self) -> ClientStats:
        """A snapshot of the client-side counters."""
        return self._counters.snapshot()
