"""Micro-batching and retries: calls in, batches out, every call answered once.

No HTTP here: the dispatcher is given a `send` coroutine (the httpx edge in production, a plain
function in unit tests) that turns encoded requests into a BatchOutcome.

One call's life: submit -> pending queue -> batch (flushed when full or `max_wait_s` after its
first call) -> send -> result, or retry (back to the front of the queue after a backoff), or an
exception. A call ends exactly once, whichever comes first: its result, a non-retryable answer,
its attempts running out, or its deadline (a timer armed at submit, so a hung service or a full
queue cannot hold a caller past it).

Longer than our other modules because batching, retrying and ending a call share one state (the
pending queue, the in-flight slots, each call's timer); split up, that state would be spread out.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer_client.clock import Clock
from trainer_client.errors import (
    CallInfo,
    ClientClosedError,
    DeadlineExceededError,
    InvalidRequestError,
    RetriesExhaustedError,
    SandboxClientError,
    ServiceError,
    code_preview,
)
from trainer_client.retry import RetryPolicy, Verdict, is_retryable_item_status
from trainer_client.stats import Counters
from trainer_client.wire import INFRASTRUCTURE_STATUSES, ExecuteRequest, ExecuteResult


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What became of one POST of a batch."""

    verdict: Verdict
    results: Sequence[ExecuteResult] = ()
    """Per-item results, in request order (ANSWERED only)."""
    cause: str = ""
    """Short cause for counters: an HTTP status ("503") or an exception name ("ConnectError")."""
    detail: str = ""
    """Human-readable explanation (server message, exception text)."""
    retry_after_s: float | None = None
    """Seconds the server asked us to wait (429)."""


SendBatch = Callable[[Sequence[bytes], float], Awaitable[BatchOutcome]]
"""send(encoded ExecuteRequests, the server's largest program budget in s (DispatchConfig.budget_s))
-> outcome; never raises."""


@dataclass(eq=False)
class _Call:
    info: CallInfo
    request: ExecuteRequest
    payload: bytes
    future: asyncio.Future[ExecuteResult]
    deadline: float
    """In the retry clock's time."""
    started_perf: float
    attempts: int = 0
    """Times it was sent."""
    failures: int = 0
    """Retryable failures that count against RetryPolicy.attempts (429 does not: see _deliver)."""
    last_error: str = ""
    timer: asyncio.TimerHandle | None = None
    queued_at: float = 0.0
    """Event-loop time it last joined the pending queue."""


@dataclass
class DispatchConfig:
    """Batching and concurrency settings of one dispatcher."""

    max_batch_size: int = 64
    """Most calls in one HTTP request."""
    max_wait_s: float = 0.005
    """How long the first call of a batch waits for batch-mates before the batch is sent."""
    max_concurrency: int = 16
    """Most batches in flight at once."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Attempts, deadline and backoff of every call."""
    server_max_timeout_s: float = 60.0
    """The server's max_timeout (its default): a session cell may first replay the session's
    earlier cells, so the server budgets it that long whatever its own timeout; the read timeout
    of a batch with a cell covers it, so the client never gives up (and resends a stateful cell)
    before the server answers."""

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.max_concurrency < 1:
            raise ValueError("max_batch_size and max_concurrency must be at least 1")
        if self.server_max_timeout_s <= 0:
            raise ValueError("server_max_timeout_s must be positive")

    def budget_s(self, request: ExecuteRequest) -> float:
        """Program seconds the server may spend on `request` (the client's read timeout adds
        Timeouts.response_margin_s to the largest of a batch)."""
        if request.session_id is None:
            return request.timeout
        return max(request.timeout, self.server_max_timeout_s)
        if self.max_wait_s < 0:
            raise ValueError("max_wait_s must not be negative")


class Dispatcher:
    """Collects concurrent calls into batches, sends them, retries what is safe to retry."""

    def __init__(
        self,
        send: SendBatch,
        config: DispatchConfig,
        clock: Clock,
        counters: Counters,
        rng: random.Random | None = None,
    ) -> None:
        self._send_batch = send
        self._config = config
        self._clock = clock
        self._counters = counters
        self._rng = rng or random.Random()
        self._ids = itertools.count(1)
        self._pending: deque[_Call] = deque()
        self._outstanding: set[_Call] = set()
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._closed = False
        # Halves on 429 and grows back by one per answered batch: a batch larger than the
        # server's free queue space is refused whole, so a fixed size could be refused forever.
        self._batch_limit = config.max_batch_size

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, request: ExecuteRequest) -> ExecuteResult:
        """Queue one request and wait for its result (or its exception)."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        self.start()
        loop = asyncio.get_running_loop()
        info = CallInfo(next(self._ids), code_preview(request.code), request.session_id)
        call = _Call(
            info=info,
            request=request,
            payload=request.model_dump_json(exclude_unset=True).encode(),
            future=loop.create_future(),
            deadline=self._clock.now() + self._config.retry.deadline_s,
            started_perf=time.perf_counter(),
        )
        call.timer = loop.call_later(self._config.retry.deadline_s, self._expire, call)
        self._outstanding.add(call)
        self._counters.calls += 1
        self._enqueue(call)
        try:
            return await call.future
        except asyncio.CancelledError:
            # The caller gave up: the call is dropped from the queue (or its answer ignored).
            if self._finish(call):
                self._counters.cancelled += 1
            raise

    async def aclose(self, *, cancel: bool = False) -> None:
        """Stop accepting calls; wait for outstanding ones (or, with `cancel`, fail them now)."""
        self._closed = True
        if not cancel and self._outstanding:
            await asyncio.gather(
                *(c.future for c in list(self._outstanding)), return_exceptions=True
            )
        for call in list(self._outstanding):
            self._fail(call, ClientClosedError(f"{call.info}: the client was closed"))
        tasks = [*self._tasks, *([self._loop_task] if self._loop_task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- batching -----------------------------------------------------------------------------

    def _enqueue(self, call: _Call, *, front: bool = False) -> None:
        call.queued_at = asyncio.get_running_loop().time()
        if front:
            self._pending.appendleft(call)
        else:
            self._pending.append(call)
        # Wake the batching loop only when it has something to do: a first call, or a full
        # batch. Waking it on every call would cost a wakeup per call under load.
        if len(self._pending) == 1 or len(self._pending) >= self._batch_limit:
            self._wakeup.set()

    async def _run(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                batch = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            self._spawn(self._send(batch))

    async def _next_batch(self) -> list[_Call]:
        """Wait for a first call, then for batch-mates until full or `max_wait_s` after it."""
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            # Counted from when the oldest call arrived: calls left over from the last batch
            # have waited already.
            flush_at = self._pending[0].queued_at + self._config.max_wait_s
            while len(self._pending) < self._batch_limit:
                remaining = flush_at - loop.time()
                if remaining <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except asyncio.TimeoutError:  # not the builtin before Python 3.11
                    break
            batch = self._take(self._batch_limit)
            if batch:
                return batch

    def _take(self, limit: int) -> list[_Call]:
        batch: list[_Call] = []
        now = self._clock.now()
        while self._pending and len(batch) < limit:
            call = self._pending.popleft()
            if call.future.done():
                continue
            if now >= call.deadline:
                self._expire(call)
                continue
            batch.append(call)
        return batch

    # --- sending and answers ------------------------------------------------------------------

    async def _send(self, batch: list[_Call]) -> None:
        try:
            for call in batch:
                call.attempts += 1
            await self._deliver(batch)
        finally:
            self._slots.release()

    async def _deliver(self, batch: list[_Call]) -> None:
        batch = [c for c in batch if not c.future.done()]
        if not batch:
            return
        largest_timeout_s = max(self._config.budget_s(c.request) for c in batch)
        self._counters.http_requests += 1
        self._counters.batch_sizes[len(batch)] += 1
        started = time.perf_counter()
        outcome = await self._send_batch([c.payload for c in batch], largest_timeout_s)
        self._counters.http_latency.record(time.perf_counter() - started)
        if outcome.verdict is not Verdict.ANSWERED:
            self._counters.http_failures[outcome.cause] += 1

        if outcome.verdict is Verdict.ANSWERED and len(outcome.results) != len(batch):
            outcome = BatchOutcome(
                Verdict.RETRY,
                cause="malformed",
                detail=f"{len(outcome.results)} results for {len(batch)} requests",
            )
        if outcome.verdict is Verdict.ANSWERED:
            self._batch_limit = min(self._config.max_batch_size, self._batch_limit + 1)
            for call, result in zip(batch, outcome.results, strict=True):
                if is_retryable_item_status(result.status):
                    self._retry_later(call, result.status, f"item status {result.status}", None)
                else:
                    self._resolve(call, result)
        elif outcome.verdict is Verdict.RETRY:
            # 429 is back-pressure, not a failure of the call: the server ran nothing and says
            # when to come back. It is bounded by the deadline, not by the attempts, so that a
            # trainer under overload waits instead of failing its rollouts.
            overloaded = outcome.cause == "429"
            if overloaded:
                self._batch_limit = max(1, self._batch_limit // 2)
            reason = f"{outcome.cause}: {outcome.detail}" if outcome.detail else outcome.cause
            for call in batch:
                self._retry_later(
                    call, outcome.cause, reason, outcome.retry_after_s, failed=not overloaded
                )
        elif outcome.verdict is Verdict.INVALID:
            if len(batch) == 1:
                self._fail(batch[0], InvalidRequestError(outcome.detail, batch[0].info))
            else:
                # The service rejects a whole batch for one bad item: halve until it is alone,
                # so its batch-mates still run (in this slot, one half after the other).
                half = len(batch) // 2
                await self._deliver(batch[:half])
                await self._deliver(batch[half:])
        else:
            for call in batch:
                why = f"the service answered {outcome.cause}: {outcome.detail}"
                self._fail(call, ServiceError(call.info, why, **self._why(call)))

    def _retry_later(
        self,
        call: _Call,
        cause: str,
        reason: str,
        retry_after_s: float | None,
        *,
        failed: bool = True,
    ) -> None:
        if call.future.done():
            return
        call.last_error = reason
        call.failures += failed
        policy = self._config.retry
        if call.failures >= policy.attempts:
            why = f"all {policy.attempts} allowed attempts failed"
            self._fail(call, RetriesExhaustedError(call.info, why, **self._why(call)))
            return
        wait_s = policy.wait_s(call.attempts, self._rng, retry_after_s)
        if self._clock.now() + wait_s >= call.deadline:
            why = f"its deadline of {policy.deadline_s:g} s would pass before the next attempt"
            self._fail(call, DeadlineExceededError(call.info, why, **self._why(call)))
            return
        self._counters.retries += 1
        self._counters.retry_causes[cause] += 1
        self._spawn(self._requeue_after(call, wait_s))

    async def _requeue_after(self, call: _Call, wait_s: float) -> None:
        await self._clock.sleep(wait_s)
        if not call.future.done():
            self._enqueue(call, front=True)

    # --- ending a call ------------------------------------------------------------------------

    @staticmethod
    def _why(call: _Call) -> dict[str, Any]:
        return {"attempts": call.attempts, "last_error": call.last_error}

    def _expire(self, call: _Call) -> None:
        why = f"its deadline of {self._config.retry.deadline_s:g} s passed"
        self._fail(call, DeadlineExceededError(call.info, why, **self._why(call)))

    def _finish(self, call: _Call) -> bool:
        """Mark the call ended; False if it already was."""
        if call not in self._outstanding:
            return False
        self._outstanding.discard(call)
        if call.timer is not None:
            call.timer.cancel()
        self._counters.call_latency.record(time.perf_counter() - call.started_perf)
        return True

    def _resolve(self, call: _Call, result: ExecuteResult) -> None:
        if not self._finish(call):
            return
        self._counters.results += 1
        if result.status in INFRASTRUCTURE_STATUSES:
            self._counters.infrastructure[str(result.status)] += 1
        if not call.future.done():
            call.future.set_result(result)

    def _fail(self, call: _Call, error: SandboxClientError) -> None:
        if not self._finish(call):
            return
        self._counters.failures += 1
        if not call.future.done():
            call.future.set_exception(error)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
