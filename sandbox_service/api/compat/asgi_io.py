"""Reading and answering raw ASGI requests, for the wires served before FastAPI's routing."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Message, Receive, Send


async def read_body(receive: Receive) -> bytes:
    """The whole request body (the Edge caps its size)."""
    chunks: list[bytes] = []
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that hands `body` on once, then the client's next messages (a disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def send_bytes(
    send: Send,
    status: int,
    body: bytes = b"",
    content_type: str = "application/json",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """A whole answer."""
    start = [(b"content-length", str(len(body)).encode()), *(headers or [])]
    if body:
        start.append((b"content-type", content_type.encode()))
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


async def send_text(send: Send, status: int, text: str) -> None:
    """A plain-text answer."""
    await send_bytes(send, status, text.encode(), "text/plain; charset=utf-8")


async def send_json(
    send: Send, status: int, value: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A JSON answer."""
    await send_bytes(send, status, json.dumps(value).encode(), headers=headers)


async def disconnected(receive: Receive) -> None:
    """Return when the client has gone away (the body must have been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
