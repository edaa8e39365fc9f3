"""The one fake of the client tests: an httpx transport that injects faults in front of another.

In unit tests the inner transport is `echo_transport()` (a program's stdout is its code); in the
integration tests it is a real connection to a running service.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

import httpx

from trainer_client import VirtualClock


@dataclass(frozen=True)
class Fault:
    """One injected failure, used for one request."""

    kind: str
    """connect | status | drop | slow | garbage"""
    status_code: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    advance_s: float = 0.0
    """For `slow`: virtual seconds the response took."""


def connect_error() -> Fault:
    """The connection is refused: nothing reached the server."""
    return Fault("connect")


def status(code: int, **headers: str) -> Fault:
    """The server (or a proxy) answers `code` without running anything."""
    return Fault("status", status_code=code, headers=headers)


def drop() -> Fault:
    """The server ran the batch, then the connection dropped before the response."""
    return Fault("drop")


def slow(advance_s: float = 120.0) -> Fault:
    """The server ran the batch, but the response came after the read timeout."""
    return Fault("slow", advance_s=advance_s)


def garbage() -> Fault:
    """A 200 whose body is not a BatchResponse (a confused proxy)."""
    return Fault("garbage")


class FaultInjectingTransport(httpx.AsyncBaseTransport):
    """Applies the scripted faults to successive requests, then passes requests through."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        faults: list[Fault] | None = None,
        clock: VirtualClock | None = None,
    ) -> None:
        self.inner = inner
        self.faults: deque[Fault] = deque(faults or [])
        self.clock = clock
        self.requests: list[httpx.Request] = []
        self.forwarded = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        fault = self.faults.popleft() if self.faults else None
        if fault is None:
            return await self._forward(request)
        if fault.kind == "connect":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if fault.kind == "status":
            body = json.dumps({"detail": f"injected {fault.status_code}"}).encode()
            return httpx.Response(fault.status_code, headers=fault.headers, content=body)
        if fault.kind == "garbage":
            return httpx.Response(200, content=b"<html>502 Bad Gateway</html>")
        response = await self._forward(request)
        await response.aread()
        await response.aclose()
        if fault.kind == "drop":
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        if fault.kind == "slow":
            if self.clock is not None:
                self.clock.advance(fault.advance_s)
            raise httpx.ReadTimeout("timed out", request=request)
        raise AssertionError(f"unknown fault {fault.kind}")

    async def _forward(self, request: httpx.Request) -> httpx.Response:
        self.forwarded += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def echo_transport(ran: list[str] | None = None) -> httpx.MockTransport:
    """A stand-in service for unit tests: stdout is the code, `#status=X` sets the status,
    and a code of "BAD" makes the batch a 422 naming its index, as the real service does."""

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/execute/batch"
        items = json.loads(request.content)["requests"]
        bad = [i for i, item in enumerate(items) if item["code"] == "BAD"]
        if bad:
            detail = [{"loc": ["body", "requests", bad[0], "code"], "msg": "invalid code"}]
            return httpx.Response(422, json={"detail": detail})
        results = []
        for item in items:
            code = item["code"]
            if ran is not None:
                ran.append(code)
            state = code.split("#status=")[1] if "#status=" in code else "ok"
            results.append({"id": code, "status": state, "stdout": code + item.get("stdin", "")})
        return httpx.Response(200, json={"results": results})

    return httpx.MockTransport(handle)


def verify_transport(seen: list[list[str]] | None = None) -> httpx.MockTransport:
    """A stand-in /verify for unit tests: equal strings are `correct`, others `incorrect`; an
    answer `busy:N:X` is answered `queue_timeout` its first N times, then judged as X; `seen`
    gets each request's answers."""
    asked: dict[str, int] = {}

    def judge(answer: str, reference: str) -> dict[str, object]:
        if answer.startswith("busy:"):
            _, times, rest = answer.split(":", 2)
            asked[answer] = asked.get(answer, 0) + 1
            if asked[answer] <= int(times):
                return {"verdict": "invalid", "reason": "queue_timeout", "detail": "no worker"}
            answer = rest
        if answer == reference:
            return {"verdict": "correct", "reason": "equivalent", "time": 0.01}
        return {"verdict": "incorrect", "reason": "not_equivalent", "time": 0.01}

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/verify"
        body = json.loads(request.content)
        if seen is not None:
            seen.append([item["answer"] for item in body["items"]])
        results = [judge(item["answer"], item["reference"]) for item in body["items"]]
        return httpx.Response(200, json={"results": results})

    return httpx.MockTransport(handle)
