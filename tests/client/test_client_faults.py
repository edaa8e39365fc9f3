"""Retries through HTTP: faults injected by an httpx transport, the one seam the tests fake."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from fault_transport import (
    FaultInjectingTransport,
    connect_error,
    drop,
    echo_transport,
    garbage,
    slow,
    status,
)

from trainer_client import (
    DeadlineExceededError,
    InvalidRequestError,
    RetriesExhaustedError,
    RetryPolicy,
    SandboxClient,
    ServiceError,
    VirtualClock,
)
from trainer_client.http import error_detail

FAST_RETRY = RetryPolicy(attempts=6, wait_initial_s=0.5, wait_jitter_s=0.1)


def client_with(
    transport: httpx.AsyncBaseTransport,
    clock: VirtualClock,
    *,
    retry: RetryPolicy = FAST_RETRY,
    **options: object,
) -> SandboxClient:
    return SandboxClient(
        "http://sandbox.test",
        transport=transport,
        clock=clock,
        retry=retry,
        rng=random.Random(0),
        **options,  # type: ignore[arg-type]
    )


async def test_connection_refused_then_answered() -> None:
    clock = VirtualClock()
    transport = FaultInjectingTransport(echo_transport(), [connect_error(), connect_error()])
    async with client_with(transport, clock) as client:
        result = await client.execute("print(1)")
        stats = client.stats()
    assert result.status == "ok" and result.stdout == "print(1)"
    assert len(clock.sleeps) == 2 and len(transport.requests) == 3
    assert stats.http_failures == {"ConnectError": 2} and stats.retries == 2


async def test_429_waits_at_least_retry_after() -> None:
    clock = VirtualClock()
    transport = FaultInjectingTransport(echo_transport(), [status(429, **{"Retry-After": "3"})])
    async with client_with(transport, clock) as client:
        assert (await client.execute("x")).status == "ok"
    assert clock.sleeps[0] >= 3
    assert transport.forwarded == 1  # the 429 ran nothing; the retry ran it once


@pytest.mark.parametrize("code", [502, 503, 504])
async def test_gateway_and_unavailable_answers_are_retried(code: int) -> None:
    clock = VirtualClock()
    transport = FaultInjectingTransport(echo_transport(), [status(code)])
    async with client_with(transport, clock) as client:
        assert (await client.execute("x")).stdout == "x"
        assert client.stats().retry_causes == {str(code): 1}


async def test_a_dropped_connection_is_retried() -> None:
    ran: list[str] = []
    transport = FaultInjectingTransport(echo_transport(ran), [drop()])
    async with client_with(transport, VirtualClock()) as client:
        assert (await client.execute("y")).stdout == "y"
    # The service ran it before the connection dropped, and again on retry: at-least-once.
    assert ran == ["y", "y"]


async def test_a_slow_response_is_retried() -> None:
    clock = VirtualClock()
    transport = FaultInjectingTransport(echo_transport(), [slow(5)], clock)
    async with client_with(transport, clock) as client:
        assert (await client.execute("z")).stdout == "z"
        assert client.stats().http_failures == {"ReadTimeout": 1}


async def test_slow_responses_past_the_deadline_end_in_a_named_error() -> None:
    clock = VirtualClock()
    transport = FaultInjectingTransport(echo_transport(), [slow(40)] * 5, clock)
    policy = RetryPolicy(attempts=10, deadline_s=100, wait_jitter_s=0)
    async with client_with(transport, clock, retry=policy) as client:
        with pytest.raises(DeadlineExceededError) as caught:
            await client.execute("while True: pass", session_id="traj-3")
    message = str(caught.value)
    assert "call #1" in message and "while True: pass" in message and "traj-3" in message
    assert "ReadTimeout" in message and caught.value.attempts == 3


async def test_attempts_run_out_with_a_named_error() -> None:
    transport = FaultInjectingTransport(echo_transport(), [connect_error()] * 10)
    async with client_with(transport, VirtualClock(), retry=RetryPolicy(attempts=4)) as client:
        with pytest.raises(RetriesExhaustedError, match=r"call #1 .*4 attempt.*ConnectError"):
            await client.execute("print(2)")
    assert len(transport.requests) == 4


async def test_a_500_is_not_retried() -> None:
    transport = FaultInjectingTransport(echo_transport(), [status(500)])
    async with client_with(transport, VirtualClock()) as client:
        with pytest.raises(ServiceError, match="500"):
            await client.execute("x")
    assert len(transport.requests) == 1


async def test_a_garbled_200_is_retried() -> None:
    transport = FaultInjectingTransport(echo_transport(), [garbage()])
    async with client_with(transport, VirtualClock()) as client:
        assert (await client.execute("x")).stdout == "x"
        assert client.stats().retry_causes == {"malformed": 1}


async def test_per_item_infrastructure_statuses_are_retried() -> None:
    ran: list[str] = []
    inner = echo_transport(ran)
    answers = iter(["#status=sandbox_error", "#status=queue_timeout"])

    async def handle(request: httpx.Request) -> httpx.Response:
        response = await inner.handle_async_request(request)
        await response.aread()
        body = response.json()
        for result in body["results"]:
            if result["stdout"] == "flaky":
                result["status"] = next(answers, "#status=ok").split("=")[1]
        return httpx.Response(200, json=body)

    transport = FaultInjectingTransport(httpx.MockTransport(handle))
    async with client_with(transport, VirtualClock(), max_wait_s=0.01) as client:
        flaky, steady = await asyncio.gather(client.execute("flaky"), client.execute("steady"))
        stats = client.stats()
    assert flaky.status == "ok" and steady.status == "ok"
    assert ran.count("steady") == 1 and ran.count("flaky") == 3
    assert stats.retry_causes == {"sandbox_error": 1, "queue_timeout": 1}


async def test_an_invalid_item_fails_alone_through_http() -> None:
    ran: list[str] = []
    transport = FaultInjectingTransport(echo_transport(ran))
    codes = [f"print({i})" for i in range(7)]
    codes.insert(3, "BAD")
    async with client_with(transport, VirtualClock(), max_wait_s=0.05) as client:
        outcomes = await client.execute_many([{"code": c} for c in codes], return_exceptions=True)
    assert isinstance(outcomes[3], InvalidRequestError)
    assert "invalid code" in str(outcomes[3])
    assert [getattr(o, "stdout", None) for o in outcomes] == [*codes[:3], None, *codes[4:]]
    assert sorted(ran) == sorted(c for c in codes if c != "BAD")


async def test_the_api_key_is_sent_as_a_bearer_token() -> None:
    transport = FaultInjectingTransport(echo_transport())
    async with client_with(transport, VirtualClock(), api_key="s3cret") as client:
        await client.execute("x")
    assert transport.requests[0].headers["authorization"] == "Bearer s3cret"


async def test_a_local_mistake_is_refused_before_sending() -> None:
    transport = FaultInjectingTransport(echo_transport())
    async with client_with(transport, VirtualClock()) as client:
        with pytest.raises(InvalidRequestError, match="memory_mb"):
            await client.execute("x", memory_mb=1)
        with pytest.raises(InvalidRequestError, match="language"):
            await client.execute_many([{"code": "x", "language": "cobol"}])
    assert transport.requests == []


async def test_every_call_is_answered_through_a_storm_of_faults() -> None:
    rng = random.Random(7)
    kinds = [connect_error(), drop(), garbage(), status(503), status(429), status(502)]
    faults = [rng.choice(kinds) for _ in range(400) if rng.random() < 0.5]
    transport = FaultInjectingTransport(echo_transport(), faults)
    policy = RetryPolicy(attempts=50, wait_initial_s=0.1, wait_max_s=1)
    async with client_with(
        transport, VirtualClock(), retry=policy, max_batch_size=8, max_concurrency=4
    ) as client:
        codes = [f"print({i})" for i in range(500)]
        results = await client.execute_many([{"code": c} for c in codes])
        stats = client.stats()
    assert [r.stdout for r in results] == codes
    assert stats.results == 500 and stats.failures == 0 and stats.retries > 0


def test_error_details_name_the_field() -> None:
    body = (
        b'{"detail": [{"type": "less_than_equal", "loc": ["body", "requests", 3, "timeout"],'
        b' "msg": "Input should be less than or equal to 60"}]}'
    )
    assert error_detail(body, "x") == "timeout: Input should be less than or equal to 60"
    assert error_detail(b'{"detail": "the queue is full (2 jobs)"}', "x") == (
        "the queue is full (2 jobs)"
    )
    assert error_detail(b"<html>oops</html>", "x") == "<html>oops</html>"
    assert error_detail(b"", "Bad Gateway") == "Bad Gateway"
