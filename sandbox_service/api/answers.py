"""Answers sent as the client reads them, and the process's bound on answers not yet read.

A large answer (fetched files above all) is never built whole: `json_chunks` encodes a result
in pieces of at most CHUNK_CHARS, a long string sliced as it goes, so the only full copy held is
the result itself; `JsonAnswer` sends the pieces one by one, each `send` waiting while the
connection's send buffer is full (uvicorn's flow control). A client that does not read holds
its answer until the send deadline (connections.py, `send_timeout_s`) closes the connection.

`AnswerLedger` counts the bytes of large answers being sent, per process and per tenant,
against `max_unread_answer_bytes`: when tenants share the server, each may hold its weight's
share of it (and always one answer of its own, with the process's bound kept), so a tenant
whose clients never read fills only its own share. A large answer that would go over is
replaced by a 503 (`Unavailable`, the service's own refusal, safe to retry; the result is
dropped), and while a tenant's room left is less than one call's largest answer, its new calls
are refused 503 before they run. Answers under one chunk are sent whole and not counted (the
connection cap bounds them).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sandbox_service.api.dispatch import Unavailable
from sandbox_service.session_shares import share
from sandbox_service.tenancy import tenant_var

CHUNK_CHARS = 64 * 1024
"""Largest piece of an answer body handed to the server at once (and the size under which an
answer is sent whole)."""

_NEEDS_ESCAPE = re.compile(r'[\\"\x00-\x1f\x7f-\U0010ffff]')
"""Characters json.dumps (ensure_ascii) does not copy as they are."""


class AnswerLedger:
    """Bytes of large answers this process is sending, per tenant, against its bound."""

    def __init__(
        self, max_bytes: int, room_per_call: int, weights: Mapping[str, float] | None = None
    ) -> None:
        self.max_bytes = max_bytes
        self.room_per_call = room_per_call
        """The largest answer one call makes (its fetched files in base64, its outputs)."""
        self.weights = dict(weights or {})
        """Tenant -> weight when tenants share the server (one tenant or none: no shares)."""
        self.held: dict[str, int] = {}

    @property
    def held_bytes(self) -> int:
        return sum(self.held.values())

    def share(self, tenant: str) -> int:
        """The bytes `tenant`'s answers may hold: its weight's share of the bound (a tenant not
        in the weights counts with weight 1), the whole bound when no tenants share it."""
        if len(self.weights) <= 1:
            return self.max_bytes
        return share(self.max_bytes, self.weights, tenant)

    def over(self, tenant: str) -> str | None:
        """Why a new call of `tenant` is refused now (its answer might not fit), or None."""
        own = self.held.get(tenant, 0)
        if own == 0 or (
            own + self.room_per_call <= self.share(tenant)
            and self.held_bytes + self.room_per_call <= self.max_bytes
        ):
            return None
        return (
            f"this API process holds {own} bytes of this tenant's answers (of "
            f"{self.held_bytes} in all) that its clients have not read yet "
            f"(max_unread_answer_bytes {self.max_bytes}, this tenant's share "
            f"{self.share(tenant)}): no room for another answer; retry later"
        )

    def take(self, tenant: str, size: int) -> str | None:
        """Count `size` bytes to `tenant`, or say why they would go over its share or the
        process's bound (nothing counted). A tenant holding nothing may always take one answer
        that fits the process's bound, however small its share."""
        own = self.held.get(tenant, 0)
        within_share = own == 0 or own + size <= self.share(tenant)
        if not within_share or self.held_bytes + size > self.max_bytes:
            return (
                f"an answer of {size} bytes would take this API process past "
                f"max_unread_answer_bytes ({self.max_bytes}, this tenant's share "
                f"{self.share(tenant)}; {own} held by this tenant's answers and "
                f"{self.held_bytes} in all, which clients are still reading): the result was "
                "dropped; retry later"
            )
        self.held[tenant] = own + size
        return None

    def give_back(self, tenant: str, size: int) -> None:
        left = self.held.get(tenant, 0) - size
        if left > 0:
            self.held[tenant] = left
        else:
            self.held.pop(tenant, None)


def json_chunks(value: Any) -> Iterator[str]:
    """`json.dumps(value)` in pieces: no piece is longer than CHUNK_CHARS unless one scalar's
    own encoding is (a long string is sliced; its escapes never split)."""
    if isinstance(value, str):
        yield from _string_chunks(value)
    elif isinstance(value, dict):
        if len(value) == 0:
            yield "{}"
            return
        yield "{"
        for index, (key, item) in enumerate(value.items()):
            yield (", " if index else "") + json.dumps(key) + ": "
            yield from json_chunks(item)
        yield "}"
    elif isinstance(value, list | tuple):
        if len(value) == 0:
            yield "[]"
            return
        yield "["
        for index, item in enumerate(value):
            if index:
                yield ", "
            yield from json_chunks(item)
        yield "]"
    else:
        yield json.dumps(value)


def _string_chunks(text: str) -> Iterator[str]:
    if len(text) <= CHUNK_CHARS:
        yield json.dumps(text)
        return
    plain = _NEEDS_ESCAPE.search(text) is None  # base64, the large case: copied as it is
    yield '"'
    step = CHUNK_CHARS if plain else CHUNK_CHARS // 12  # at most 12 per character (a pair)
    for start in range(0, len(text), step):
        piece = text[start : start + step]
        yield piece if plain else json.dumps(piece)[1:-1]
    yield '"'


def is_large(value: Any) -> bool:
    """Whether `value` holds a string longer than CHUNK_CHARS (so its answer is streamed)."""
    if isinstance(value, str):
        return len(value) > CHUNK_CHARS
    if isinstance(value, dict):
        return any(is_large(item) for item in value.values())
    if isinstance(value, list | tuple):
        return any(is_large(item) for item in value)
    return False


class JsonAnswer(Response):
    """A JSON answer sent in pieces with backpressure, its bytes counted in `ledger` while it
    is sent. Build it with `answer`."""

    def __init__(self, value: Any, size: int, ledger: AnswerLedger, tenant: str) -> None:
        super().__init__(media_type="application/json")
        self._value = value
        self._size = size
        self._ledger = ledger
        self._tenant = tenant
        self.headers["content-length"] = str(size)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            pieces: list[bytes] = []
            pending = 0
            for piece in json_chunks(self._value):
                pieces.append(piece.encode())
                pending += len(piece)
                if pending >= CHUNK_CHARS:
                    body = b"".join(pieces)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                    pieces, pending = [], 0
            await send({"type": "http.response.body", "body": b"".join(pieces)})
        finally:
            self._value = None
            self._ledger.give_back(self._tenant, self._size)


def answer(value: Any, ledger: AnswerLedger) -> Response:
    """The 200 answer of `value` (JSON): whole when small, else a JsonAnswer counted in
    `ledger`; `Unavailable` when it would take the process past its bound."""
    if not is_large(value):
        return Response(json.dumps(value), media_type="application/json")
    size = sum(len(piece) for piece in json_chunks(value))  # ASCII: characters are bytes
    tenant = tenant_var.get().name
    refused = ledger.take(tenant, size)
    if refused is not None:
        raise Unavailable(refused)
    return JsonAnswer(value, size, ledger, tenant)


async def send_bytes_counted(
    send: Send, data: bytes, content_type: str, ledger: AnswerLedger
) -> str | None:
    """A 200 of raw bytes (an E2B file read) sent in pieces with backpressure, counted in
    `ledger` while sent; when it would go over the bound, nothing is sent and the reason is
    returned (the caller answers it in its wire's shape)."""
    large = len(data) > CHUNK_CHARS
    tenant = tenant_var.get().name
    if large:
        refused = ledger.take(tenant, len(data))
        if refused is not None:
            return refused
    headers = [
        (b"content-length", str(len(data)).encode()),
        (b"content-type", content_type.encode()),
    ]
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        view = memoryview(data)
        for start in range(0, len(data), CHUNK_CHARS):
            piece = bytes(view[start : start + CHUNK_CHARS])
            more = start + CHUNK_CHARS < len(data)
            await send({"type": "http.response.body", "body": piece, "more_body": more})
        if not data:
            await send({"type": "http.response.body", "body": b""})
    finally:
        if large:
            ledger.give_back(tenant, len(data))
    return None
