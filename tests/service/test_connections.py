"""Silent, half-sent and dripping connections against a real `rl-sandbox api` process: each is
answered 408 and closed after its deadline (before the API key is read), past max_connections a
new one is closed at once, and the API answers ordinary calls all along."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandbox_service.local.redis_server import RedisServer
from tests.service.stack import Stack, stack_env

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 50
KEY = "conn-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
WAIT_S = 60.0
"""How long a test waits for the API to close a connection (far past every deadline)."""


@pytest.fixture(scope="module")
def guarded(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    """An API (no workers) with short read deadlines, a small connection cap and a key."""
    env = stack_env(
        redis_server.url, "conn", 62800, api_key=KEY,
        header_timeout_s=HEADER_TIMEOUT_S, body_timeout_s=BODY_TIMEOUT_S, max_header_bytes=4096,
    )  # fmt: skip
    stack = Stack(env, logs_dir / "conn.log", workers=False).start(ready=False)
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def patient(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    """An API with deadlines far longer than a test needs to open its connections (10 s, 20 s)
    and a small connection cap: what it checks does not depend on the machine's speed."""
    env = stack_env(
        redis_server.url, "conn-cap", 62810, api_key=KEY,
        header_timeout_s=10, body_timeout_s=20, max_connections=MAX_CONNECTIONS,
    )  # fmt: skip
    stack = Stack(env, logs_dir / "conn-cap.log", workers=False).start(ready=False)
    yield stack
    stack.stop()


def open_descriptors(stack: Stack) -> int:
    assert stack.api is not None
    return len(os.listdir(f"/proc/{stack.api.pid}/fd"))


async def hold(stack: Stack, sent: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", stack.port)
    if sent:
        writer.write(sent)
        await writer.drain()
    return reader, writer


async def until_closed(reader: asyncio.StreamReader, started: float) -> tuple[bytes, float]:
    """What the server sent before closing, and when it closed (seconds since `started`)."""
    try:
        data = await asyncio.wait_for(reader.read(), WAIT_S)
    except ConnectionResetError:
        data = b""
    return data, time.monotonic() - started


async def healthy(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        assert (await client.get("/healthz")).status_code == 200
        refused = await client.post("/execute", json={"code": "1", "timeout": 0.0001}, headers=AUTH)
        assert refused.status_code == 422, refused.text


HALF_SENT = {
    "silent": b"",
    "half a request line": b"POST /exec",
    "half the headers": b"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Le",
    "half a body": (
        b"POST /execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"code\":"
    ),
}  # fmt: skip


async def test_silent_and_half_sent_connections_are_closed_at_their_deadline(
    guarded: Stack,
) -> None:
    before = open_descriptors(guarded)
    started = time.monotonic()
    held = {
        kind: [await hold(guarded, sent) for _ in range(100)] for kind, sent in HALF_SENT.items()
    }
    await healthy(guarded)  # while all 400 are held
    closing = {
        kind: await asyncio.gather(*(until_closed(reader, started) for reader, _ in conns))
        for kind, conns in held.items()
    }
    for kind, outcomes in closing.items():
        for data, _ in outcomes:
            assert data.startswith(b"HTTP/1.1 408 "), f"{kind}: {data[:200]!r}"
        assert b"not received within" in outcomes[0][0], outcomes[0][0]
        times = sorted(t for _, t in outcomes)
        print(f"{kind}: closed after {times[0]:.2f} to {times[-1]:.2f} s")
    for conns in held.values():
        for _, writer in conns:
            writer.close()
    await healthy(guarded)
    after = open_descriptors(guarded)
    print(f"API descriptors: {before} before, {after} after")
    assert after <= before + 4, (before, after)


async def test_a_head_sent_a_byte_at_a_time_is_closed_at_the_head_deadline(guarded: Stack) -> None:
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
    started = time.monotonic()
    reader, writer = await hold(guarded, b"")
    closed = asyncio.create_task(until_closed(reader, started))
    sent = 0
    with contextlib.suppress(ConnectionError):
        while sent < len(head) and not closed.done():  # all of it: 11.8 s at a byte per 50 ms
            writer.write(head[sent : sent + 1])
            await writer.drain()
            sent += 1
            await asyncio.sleep(0.05)
    data, closed_s = await closed
    print(f"dripped head: {sent} of {len(head)} bytes sent, closed after {closed_s:.2f} s")
    assert sent < len(head) and data.startswith(b"HTTP/1.1 408 "), (sent, data[:200])
    writer.close()


async def test_empty_lines_after_a_response_do_not_hold_the_connection(guarded: Stack) -> None:
    started = time.monotonic()
    reader, writer = await hold(guarded, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await reader.readuntil(b'{"status":"ok"}')).startswith(b"HTTP/1.1 200 ")
    closed = asyncio.create_task(until_closed(reader, started))
    sent = 0
    with contextlib.suppress(ConnectionError):
        while sent < 100 and not closed.done():  # 10 s of empty lines, one per 100 ms
            writer.write(b"\r\n")
            await writer.drain()
            sent += 1
            await asyncio.sleep(0.1)
    data, closed_s = await closed
    print(f"empty lines: {sent} sent, closed after {closed_s:.2f} s")
    assert sent < 100 and data.startswith(b"HTTP/1.1 408 "), (sent, data[:200])
    writer.close()


async def test_a_head_over_max_header_bytes_is_431(guarded: Stack) -> None:
    reader, writer = await hold(
        guarded, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192 + b"\r\n\r\n"
    )
    data, _ = await until_closed(reader, time.monotonic())
    assert data.startswith(b"HTTP/1.1 431 "), data[:200]
    writer.close()


async def test_past_max_connections_a_new_connection_is_closed_at_once(patient: Stack) -> None:
    started = time.monotonic()
    conns = [await hold(patient, b"") for _ in range(MAX_CONNECTIONS + 30)]
    outcomes = await asyncio.gather(*(until_closed(reader, started) for reader, _ in conns))
    refused = [t for data, t in outcomes if data == b""]
    timed_out = [t for data, t in outcomes if data.startswith(b"HTTP/1.1 408 ")]
    print(f"{len(refused)} closed unread after {max(refused):.2f} s at most, "
          f"{len(timed_out)} held until the head deadline ({min(timed_out):.2f} s)")  # fmt: skip
    assert (len(refused), len(timed_out)) == (30, MAX_CONNECTIONS)
    assert max(refused) < min(timed_out)
    for _, writer in conns:
        writer.close()
    await healthy(patient)


async def test_a_request_sent_in_pieces_within_the_deadlines_is_answered(patient: Stack) -> None:
    body = b'{"code": "1", "timeout": 1e999}'
    head = (
        b"POST /execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n"
    )  # fmt: skip
    reader, writer = await hold(patient, head[:20])
    for piece in (head[20:], body[:10], body[10:]):
        await asyncio.sleep(0.5)
        writer.write(piece)
        await writer.drain()
    data, _ = await until_closed(reader, time.monotonic())
    assert data.startswith(b"HTTP/1.1 422 "), data[:300]
    assert b'"timeout"' in data
    writer.close()
