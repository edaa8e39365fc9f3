"""SandboxClient.verify through HTTP: the /verify stand-in and injected faults (no service)."""

from __future__ import annotations

import random

import httpx
import pytest
from fault_transport import (
    FaultInjectingTransport,
    connect_error,
    garbage,
    status,
    verify_transport,
)

from trainer_client import (
    DeadlineExceededError,
    InvalidRequestError,
    RetriesExhaustedError,
    RetryPolicy,
    SandboxClient,
    ServiceError,
    SyncSandboxClient,
    VerifyItem,
    VirtualClock,
)
from trainer_client.verify import MAX_ITEMS_PER_REQUEST

FAST_RETRY = RetryPolicy(attempts=4, wait_initial_s=0.5, wait_jitter_s=0.1)


def client_with(
    transport: httpx.AsyncBaseTransport, clock: VirtualClock, retry: RetryPolicy = FAST_RETRY
) -> SandboxClient:
    return SandboxClient(
        "http://sandbox.test", transport=transport, clock=clock, retry=retry, rng=random.Random(0)
    )


async def test_verdicts_come_back_typed_and_in_order() -> None:
    async with client_with(verify_transport(), VirtualClock()) as client:
        results = await client.verify([("1", "1"), VerifyItem(answer="2", reference="3")])
    assert [r.verdict for r in results] == ["correct", "incorrect"]
    assert [r.correct for r in results] == [True, False]
    assert all(r.judged for r in results) and results[0].time == pytest.approx(0.01)


async def test_no_items_sends_nothing() -> None:
    seen: list[list[str]] = []
    async with client_with(verify_transport(seen), VirtualClock()) as client:
        assert await client.verify([]) == []
    assert seen == []


async def test_only_the_unjudged_items_are_sent_again() -> None:
    seen: list[list[str]] = []
    clock = VirtualClock()
    async with client_with(verify_transport(seen), clock) as client:
        results = await client.verify([("a", "a"), ("busy:2:b", "b"), ("c", "x")])
    assert [r.verdict for r in results] == ["correct", "correct", "incorrect"]
    assert seen == [["a", "busy:2:b", "c"], ["busy:2:b"], ["busy:2:b"]]
    assert len(clock.sleeps) == 2


async def test_an_item_never_judged_keeps_its_verdict_after_the_attempts() -> None:
    seen: list[list[str]] = []
    async with client_with(verify_transport(seen), VirtualClock()) as client:
        results = await client.verify([("busy:99:a", "a"), ("b", "b")])
    assert results[0].verdict == "invalid" and results[0].reason == "queue_timeout"
    assert not results[0].judged and results[1].correct
    assert len(seen) == FAST_RETRY.attempts


async def test_unjudged_items_stop_at_the_deadline() -> None:
    policy = RetryPolicy(attempts=100, deadline_s=3.0, wait_initial_s=1.0, wait_jitter_s=0.0)
    seen: list[list[str]] = []
    clock = VirtualClock()
    async with client_with(verify_transport(seen), clock, policy) as client:
        results = await client.verify([("busy:99:a", "a")])
    assert results[0].reason == "queue_timeout"
    assert sum(clock.sleeps) < policy.deadline_s and 1 < len(seen) < 100


@pytest.mark.parametrize("fault", [connect_error(), status(503), status(502), garbage()])
async def test_a_failed_post_is_sent_again_whole(fault: object) -> None:
    transport = FaultInjectingTransport(verify_transport(), [fault])  # type: ignore[list-item]
    async with client_with(transport, VirtualClock()) as client:
        results = await client.verify([("1", "1"), ("2", "2")])
    assert [r.correct for r in results] == [True, True]
    assert len(transport.requests) == 2 and transport.forwarded == 1


async def test_429_waits_at_least_retry_after_and_costs_no_attempt() -> None:
    faults = [status(429, **{"Retry-After": "7"}) for _ in range(FAST_RETRY.attempts + 1)]
    clock = VirtualClock()
    transport = FaultInjectingTransport(verify_transport(), faults)
    async with client_with(transport, clock) as client:
        results = await client.verify([("1", "1")])
    assert results[0].correct
    assert len(clock.sleeps) == len(faults) and min(clock.sleeps) >= 7


async def test_connection_errors_exhaust_the_attempts() -> None:
    faults = [connect_error() for _ in range(FAST_RETRY.attempts)]
    transport = FaultInjectingTransport(verify_transport(), faults)
    async with client_with(transport, VirtualClock()) as client:
        with pytest.raises(RetriesExhaustedError, match="ConnectError"):
            await client.verify([("1", "1")])
    assert transport.forwarded == 0


async def test_a_service_down_past_the_deadline_raises() -> None:
    policy = RetryPolicy(attempts=1000, deadline_s=10.0, wait_jitter_s=0.0)
    transport = FaultInjectingTransport(verify_transport(), [connect_error()] * 1000)
    async with client_with(transport, VirtualClock(), policy) as client:
        with pytest.raises(DeadlineExceededError):
            await client.verify([("1", "1")])


async def test_422_and_500_are_not_retried() -> None:
    for fault, error in ((status(422), InvalidRequestError), (status(500), ServiceError)):
        transport = FaultInjectingTransport(verify_transport(), [fault])
        async with client_with(transport, VirtualClock()) as client:
            with pytest.raises(error):
                await client.verify([("1", "1")])
        assert len(transport.requests) == 1


async def test_large_calls_are_split_under_the_request_bound() -> None:
    seen: list[list[str]] = []
    items = [(str(i), str(i if i % 3 else -1)) for i in range(MAX_ITEMS_PER_REQUEST * 2 + 5)]
    async with client_with(verify_transport(seen), VirtualClock()) as client:
        results = await client.verify(items)
    assert sorted(len(s) for s in seen) == [5, MAX_ITEMS_PER_REQUEST, MAX_ITEMS_PER_REQUEST]
    assert [r.correct for r in results] == [i % 3 != 0 for i in range(len(items))]


def test_the_sync_facade_verifies() -> None:
    with SyncSandboxClient("http://sandbox.test", transport=verify_transport()) as client:
        results = client.verify([("1", "1"), ("1", "2")])
    assert [r.correct for r in results] == [True, False]
