"""Micro-batching, ordering, per-item retries and deadlines of the dispatcher, without a service.

The dispatcher is given a plain `send` function instead of HTTP; the retry clock is virtual, so
backoffs never sleep and deadlines are checked deterministically.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from trainer_client import (
    ClientClosedError,
    DeadlineExceededError,
    InvalidRequestError,
    RetriesExhaustedError,
    RetryPolicy,
    ServiceError,
    VirtualClock,
)
from trainer_client.clock import LoopClock
from trainer_client.dispatch import BatchOutcome, DispatchConfig, Dispatcher
from trainer_client.retry import Verdict
from trainer_client.stats import Counters
from trainer_client.wire import ExecuteRequest, ExecuteResult

Decide = Callable[[list[ExecuteRequest]], BatchOutcome | None]


class FakeService:
    """Answers batches: each program's stdout is its code; `decide` may override a whole batch."""

    def __init__(self, decide: Decide | None = None) -> None:
        self.decide = decide
        self.batches: list[list[str]] = []
        self.sent = Counter[str]()
        self.item_status: dict[str, list[str]] = {}
        """code -> statuses to answer on successive sends (then ok)."""
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self._arrivals = asyncio.Condition()

    async def send(self, payloads: Sequence[bytes], largest_timeout_s: float) -> BatchOutcome:
        requests = [ExecuteRequest.model_validate(json.loads(p)) for p in payloads]
        codes = [r.code for r in requests]
        self.batches.append(codes)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        async with self._arrivals:
            self._arrivals.notify_all()
        try:
            if self.gate is not None:
                await self.gate.wait()
            else:
                await asyncio.sleep(0)
        finally:
            self.in_flight -= 1
        if self.decide is not None and (outcome := self.decide(requests)) is not None:
            return outcome
        results = []
        for code in codes:
            self.sent[code] += 1
            queued = self.item_status.get(code, [])
            status = queued.pop(0) if queued else "ok"
            results.append(ExecuteResult(id=code, status=status, stdout=code))
        return BatchOutcome(Verdict.ANSWERED, results=results)

    async def wait_in_flight(self, n: int) -> None:
        """Until `n` batches are being answered at once."""
        async with self._arrivals:
            await self._arrivals.wait_for(lambda: self.in_flight >= n)


def make(
    service: FakeService,
    *,
    max_batch_size: int = 64,
    max_wait_s: float = 0.001,
    max_concurrency: int = 4,
    retry: RetryPolicy | None = None,
    clock: VirtualClock | LoopClock | None = None,
) -> tuple[Dispatcher, Counters, VirtualClock | LoopClock]:
    counters = Counters()
    clock = clock or VirtualClock()
    config = DispatchConfig(
        max_batch_size=max_batch_size,
        max_wait_s=max_wait_s,
        max_concurrency=max_concurrency,
        retry=retry or RetryPolicy(wait_jitter_s=0),
    )
    return Dispatcher(service.send, config, clock, counters, random.Random(0)), counters, clock


def req(code: str, **fields: object) -> ExecuteRequest:
    return ExecuteRequest.model_validate({"code": code, **fields})


async def test_results_come_back_in_order_under_concurrency() -> None:
    service = FakeService()
    dispatcher, counters, _ = make(service, max_batch_size=16)
    codes = [f"print({i})" for i in range(300)]
    results = await asyncio.gather(*(dispatcher.submit(req(c)) for c in codes))
    assert [r.stdout for r in results] == codes
    stats = counters.snapshot()
    assert stats.calls == stats.results == 300 and stats.in_flight_calls == 0
    assert max(stats.batch_sizes) <= 16
    assert stats.http_requests < 300  # calls were batched, not sent one by one
    await dispatcher.aclose()


async def test_a_full_batch_is_sent_without_waiting_for_the_timer() -> None:
    service = FakeService()
    # An hour of max_wait_s: only flushing on size can answer these in time.
    dispatcher, counters, _ = make(service, max_batch_size=4, max_wait_s=3600)
    calls = [dispatcher.submit(req(str(i))) for i in range(8)]
    await asyncio.wait_for(asyncio.gather(*calls), timeout=30)
    assert counters.snapshot().batch_sizes == {4: 2}
    await dispatcher.aclose()


async def test_a_partial_batch_is_sent_after_max_wait() -> None:
    service = FakeService()
    dispatcher, _, _ = make(service, max_batch_size=64, max_wait_s=0.01)
    results = await asyncio.gather(*(dispatcher.submit(req(str(i))) for i in range(3)))
    assert [r.stdout for r in results] == ["0", "1", "2"]
    assert service.batches == [["0", "1", "2"]]
    await dispatcher.aclose()


async def test_in_flight_batches_are_bounded() -> None:
    service = FakeService()
    service.gate = asyncio.Event()
    dispatcher, _, _ = make(service, max_batch_size=1, max_concurrency=3)
    calls = asyncio.gather(*(dispatcher.submit(req(str(i))) for i in range(12)))
    await service.wait_in_flight(3)
    for _ in range(20):  # the others stay queued while every slot is busy
        await asyncio.sleep(0)
    assert service.in_flight == 3
    service.gate.set()
    assert len(await calls) == 12
    assert service.max_in_flight == 3
    await dispatcher.aclose()


async def test_only_infrastructure_failures_are_retried_and_only_those_items() -> None:
    service = FakeService()
    service.item_status = {
        "a": ["queue_timeout", "sandbox_error"],
        "b": ["error"],
        "c": ["timeout"],
        "d": ["memory_limit"],
        "e": ["killed"],
    }
    dispatcher, counters, clock = make(service)
    results = await asyncio.gather(*(dispatcher.submit(req(c)) for c in "abcdef"))
    assert [r.status for r in results] == ["ok", "error", "timeout", "memory_limit", "killed", "ok"]
    assert service.sent == Counter({"a": 3, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1})
    stats = counters.snapshot()
    assert stats.retries == 2
    assert stats.retry_causes == {"queue_timeout": 1, "sandbox_error": 1}
    assert isinstance(clock, VirtualClock) and len(clock.sleeps) == 2
    await dispatcher.aclose()


async def test_whole_batch_failures_retry_every_item_with_backoff() -> None:
    answers = iter(["503", "ConnectError"])

    def decide(requests: list[ExecuteRequest]) -> BatchOutcome | None:
        cause = next(answers, None)
        return None if cause is None else BatchOutcome(Verdict.RETRY, cause=cause)

    service = FakeService(decide)
    policy = RetryPolicy(wait_initial_s=1.0, wait_exp_base=3.0, wait_jitter_s=0)
    dispatcher, counters, clock = make(service, max_batch_size=1, max_concurrency=1, retry=policy)
    result = await dispatcher.submit(req("x"))
    assert result.status == "ok"
    assert isinstance(clock, VirtualClock) and clock.sleeps == [1.0, 3.0]
    stats = counters.snapshot()
    assert stats.http_failures == {"503": 1, "ConnectError": 1}
    assert stats.retry_causes == {"503": 1, "ConnectError": 1}
    await dispatcher.aclose()


async def test_retry_after_is_honoured() -> None:
    first = [True]

    def decide(requests: list[ExecuteRequest]) -> BatchOutcome | None:
        if first.pop() if first else False:
            return BatchOutcome(Verdict.RETRY, cause="429", retry_after_s=7.0)
        return None

    service = FakeService(decide)
    dispatcher, _, clock = make(service, retry=RetryPolicy(wait_initial_s=0.1, wait_jitter_s=0))
    assert (await dispatcher.submit(req("x"))).status == "ok"
    assert isinstance(clock, VirtualClock) and clock.sleeps == [7.0]
    await dispatcher.aclose()


async def test_batches_shrink_on_429_so_a_small_queue_bound_still_admits_them() -> None:
    def decide(requests: list[ExecuteRequest]) -> BatchOutcome | None:
        if len(requests) > 2:  # a server whose queue has room for two
            return BatchOutcome(Verdict.RETRY, cause="429", retry_after_s=1.0)
        return None

    service = FakeService(decide)
    dispatcher, counters, _ = make(service, max_batch_size=8, max_concurrency=1)
    results = await asyncio.gather(*(dispatcher.submit(req(str(i))) for i in range(8)))
    assert [r.stdout for r in results] == [str(i) for i in range(8)]
    sizes = counters.snapshot().batch_sizes
    assert 8 in sizes and min(sizes) <= 2  # tried whole, then small enough to be admitted
    await dispatcher.aclose()


async def test_one_invalid_item_fails_alone() -> None:
    def decide(requests: list[ExecuteRequest]) -> BatchOutcome | None:
        bad = [i for i, r in enumerate(requests) if r.code == "BAD"]
        if bad:
            detail = f"requests[{bad[0]}].timeout: must be at most 60"
            return BatchOutcome(Verdict.INVALID, cause="422", detail=detail)
        return None

    service = FakeService(decide)
    dispatcher, counters, _ = make(service, max_batch_size=16, max_concurrency=1)
    codes = [f"print({i})" for i in range(15)]
    codes.insert(9, "BAD")
    outcomes = await asyncio.gather(
        *(dispatcher.submit(req(c)) for c in codes), return_exceptions=True
    )
    error = outcomes.pop(9)
    assert isinstance(error, InvalidRequestError)
    assert "call #10" in str(error) and "'BAD'" in str(error) and "must be at most 60" in str(error)
    assert [o.stdout for o in outcomes if isinstance(o, ExecuteResult)] == codes[:9] + codes[10:]
    assert all(service.sent[c] == 1 for c in codes if c != "BAD")  # each good item ran once
    assert counters.snapshot().failures == 1
    await dispatcher.aclose()


async def test_non_retryable_answers_fail_the_batch_with_a_named_error() -> None:
    def decide(requests: list[ExecuteRequest]) -> BatchOutcome:
        return BatchOutcome(Verdict.FATAL, cause="401", detail="missing bearer token")

    dispatcher, counters, _ = make(FakeService(decide))
    with pytest.raises(ServiceError, match=r"call #1 \(code='print\(1\)'\).*401.*bearer"):
        await dispatcher.submit(req("print(1)"))
    assert counters.snapshot().retries == 0
    await dispatcher.aclose()


def _always_503(requests: list[ExecuteRequest]) -> BatchOutcome:
    return BatchOutcome(Verdict.RETRY, cause="503", detail="no worker")


async def test_attempts_are_bounded() -> None:
    policy = RetryPolicy(attempts=3, wait_initial_s=1, wait_jitter_s=0)
    service = FakeService(_always_503)
    dispatcher, _, clock = make(service, retry=policy)
    with pytest.raises(RetriesExhaustedError) as caught:
        await dispatcher.submit(req("import time; time.sleep(1)", session_id="s-7"))
    error = caught.value
    assert error.attempts == 3 and len(service.batches) == 3
    assert "call #1" in str(error) and "session='s-7'" in str(error) and "no worker" in str(error)
    assert isinstance(clock, VirtualClock) and clock.sleeps == [1, 2]
    await dispatcher.aclose()


async def test_the_deadline_bounds_retries() -> None:
    policy = RetryPolicy(
        attempts=1000, deadline_s=30, wait_initial_s=1, wait_max_s=8, wait_jitter_s=0
    )
    service = FakeService(_always_503)
    dispatcher, _, clock = make(service, retry=policy)
    with pytest.raises(DeadlineExceededError, match=r"call #1 .*deadline of 30 s"):
        await dispatcher.submit(req("x"))
    assert isinstance(clock, VirtualClock)
    assert clock.sleeps == [1, 2, 4, 8, 8] and sum(clock.sleeps) < 30
    await dispatcher.aclose()


async def test_a_hung_service_cannot_hold_a_caller_past_its_deadline() -> None:
    service = FakeService()
    service.gate = asyncio.Event()  # never set: the request never returns
    dispatcher, counters, _ = make(service, retry=RetryPolicy(deadline_s=0.05), clock=LoopClock())
    with pytest.raises(DeadlineExceededError, match="call #1"):
        await dispatcher.submit(req("while True: pass"))
    assert counters.snapshot().failures == 1
    await dispatcher.aclose(cancel=True)


async def test_a_mismatched_answer_is_retried() -> None:
    short = [True]

    def decide(requests: list[ExecuteRequest]) -> BatchOutcome | None:
        if short and short.pop():
            return BatchOutcome(Verdict.ANSWERED, results=[])
        return None

    dispatcher, counters, _ = make(FakeService(decide))
    assert (await dispatcher.submit(req("x"))).stdout == "x"
    assert counters.snapshot().retry_causes == {"malformed": 1}
    await dispatcher.aclose()


async def test_a_cancelled_caller_is_dropped() -> None:
    service = FakeService()
    service.gate = asyncio.Event()
    dispatcher, counters, _ = make(service)
    task = asyncio.ensure_future(dispatcher.submit(req("x")))
    await service.wait_in_flight(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    service.gate.set()
    await dispatcher.aclose()
    stats = counters.snapshot()
    assert stats.cancelled == 1 and stats.results == 0 and stats.in_flight_calls == 0


async def test_close_waits_for_outstanding_calls_then_refuses_new_ones() -> None:
    service = FakeService()
    dispatcher, _, _ = make(service)
    pending = asyncio.ensure_future(dispatcher.submit(req("x")))
    await asyncio.sleep(0)
    await dispatcher.aclose()
    assert pending.done() and pending.result().stdout == "x"
    with pytest.raises(ClientClosedError):
        await dispatcher.submit(req("y"))


async def test_close_with_cancel_fails_outstanding_calls() -> None:
    service = FakeService()
    service.gate = asyncio.Event()
    dispatcher, _, _ = make(service)
    pending = asyncio.ensure_future(dispatcher.submit(req("x")))
    await service.wait_in_flight(1)
    await dispatcher.aclose(cancel=True)
    with pytest.raises(ClientClosedError, match="call #1"):
        await pending


async def test_only_the_callers_fields_are_sent() -> None:
    sent: list[dict[str, object]] = []

    async def send(payloads: Sequence[bytes], largest_timeout_s: float) -> BatchOutcome:
        sent.extend(json.loads(p) for p in payloads)
        assert largest_timeout_s == 30
        return BatchOutcome(
            Verdict.ANSWERED, results=[ExecuteResult(id="1", status="ok") for _ in payloads]
        )

    config = DispatchConfig(max_wait_s=0.01)
    dispatcher = Dispatcher(send, config, VirtualClock(), Counters())
    await asyncio.gather(
        dispatcher.submit(req("a", timeout=30)), dispatcher.submit(req("b", stdin="1\n"))
    )
    assert sent == [{"code": "a", "timeout": 30.0}, {"code": "b", "stdin": "1\n"}]
    await dispatcher.aclose()


async def test_a_call_whose_deadline_passed_in_the_queue_is_never_sent() -> None:
    service = FakeService()
    service.gate = asyncio.Event()
    clock = VirtualClock()
    dispatcher, _, _ = make(
        service, max_batch_size=1, max_concurrency=1, retry=RetryPolicy(deadline_s=10), clock=clock
    )
    first = asyncio.ensure_future(dispatcher.submit(req("a")))
    await service.wait_in_flight(1)
    second = asyncio.ensure_future(dispatcher.submit(req("b")))
    await asyncio.sleep(0)
    clock.advance(20)  # the only slot stayed busy past b's deadline
    service.gate.set()
    assert (await first).stdout == "a"
    with pytest.raises(DeadlineExceededError, match="call #2"):
        await second
    assert service.batches == [["a"]]
    await dispatcher.aclose()


async def test_429_waits_do_not_use_up_attempts() -> None:
    answers = iter([*["429"] * 5, "503"])

    def decide(requests: list[ExecuteRequest]) -> BatchOutcome | None:
        cause = next(answers, None)
        return None if cause is None else BatchOutcome(Verdict.RETRY, cause=cause, retry_after_s=1)

    dispatcher, counters, _ = make(FakeService(decide), retry=RetryPolicy(attempts=2))
    assert (await dispatcher.submit(req("x"))).stdout == "x"
    assert counters.snapshot().retry_causes == {"429": 5, "503": 1}
    await dispatcher.aclose()
