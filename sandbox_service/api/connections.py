"""Read deadlines, a head size cap and a connection cap for the API's HTTP server.

uvicorn closes a keep-alive connection idle past `timeout_keep_alive`, but nothing else: a
connection that sends nothing, a request head sent a byte at a time, or a body that stops
halfway was held forever, before the API key was even read (each one a descriptor and about
35 KiB). This protocol is uvicorn's httptools one with nginx's rules added:

    state (parser callbacks)                  deadline                        on expiry
    connected, or a request's first byte      whole head within header_timeout  408, close
    head complete, body not                   whole body within body_timeout    408, close
    body complete: the app runs               none (the app's own limits)       -
    answer sent, the send buffer full         send_timeout, waited in all       abort
    response sent                             uvicorn's keep-alive              close

The way out is bounded as the way in: while the transport's send buffer is over its high-water
mark (the client is not reading), the server waits (uvicorn's flow control: the app's `send`
blocks), and the time waited is summed over the request's answer; past send_timeout the
connection is aborted, which drops the buffered bytes at once (a plain close would keep them
until the client read them) and lets the app's answer finish (its later sends are dropped), so
the answer's memory is freed. A client that reads never waits the server long enough to matter.

Both deadlines are totals, not idle times between reads (nginx's body timeout is one): a client
sending a byte every few seconds is closed all the same. A head larger than max_header_bytes is
answered 431; past max_connections open, a new connection is closed at once, before any of its
bytes is read. A pipelined request's body is not timed while the request waits its turn
(reading is paused then: not the client's delay).
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sandbox_service.logs import fields

log = logging.getLogger("sandbox_service.connections")

LOG_EVERY_S = 10.0
"""Closed connections are logged as counts, at most once this often per reason: an attack of
thousands of connections must not flood the logs."""


class _Tally:
    """Counts of connections closed, per reason, logged at most once every LOG_EVERY_S."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._logged_at = -LOG_EVERY_S

    def add(self, reason: str, now: float) -> None:
        self._counts[reason] = self._counts.get(reason, 0) + 1
        if now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            for what, count in self._counts.items():
                log.warning("closed %d connection(s): %s", count, what, extra=fields(count=count))
            self._counts.clear()


_closed = _Tally()


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one API process allows its clients' connections (settings of the same names)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_header_bytes: int = 65536
    max_connections: int = 8192
    send_timeout_s: float = 30.0


def _answer(status: str, detail: str) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with read deadlines, a head size cap and a connection cap.

    The parser's callbacks only note what the connection waits for and since when; the timer
    is set after each read, so a request that arrives whole in one read costs no timer."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting: str | None = None  # "request head", "request body" or nothing
        self._waiting_since = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._armed: tuple[str, float] | None = None
        self._reading_head = False
        self._head_bytes = 0
        self._head_too_large = False
        self._send_waited = 0.0  # seconds this request's answer has waited on the client
        self._send_paused_at: float | None = None
        self._send_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            _closed.add(f"refused at once, {self.limits.max_connections} open", self.loop.time())
            transport.abort()
            return
        self._reading_head = True
        self._wait("request head")
        self._sync_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._waiting = None
        self._sync_deadline()
        self._stop_send_deadline()
        super().connection_lost(exc)

    # --- the way out: flow control's callbacks (the transport's send buffer) ----------------------

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_paused_at is None:
            self._send_paused_at = self.loop.time()
            left = max(0.0, self.limits.send_timeout_s - self._send_waited)
            self._send_deadline = self.loop.call_later(left, self._send_expired)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._send_paused_at is not None:
            self._send_waited += self.loop.time() - self._send_paused_at
        self._stop_send_deadline()

    def _stop_send_deadline(self) -> None:
        self._send_paused_at = None
        if self._send_deadline is not None:
            self._send_deadline.cancel()
            self._send_deadline = None

    def _send_expired(self) -> None:
        self._send_deadline = None
        seconds = self.limits.send_timeout_s
        _closed.add(f"answer not read within {seconds:g} s", self.loop.time())
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._waiting is None and self._between_requests():
            # Bytes that began no request (the parser skips empty lines before one) stopped
            # uvicorn's keep-alive timer: they start the next head's deadline instead.
            self._reading_head = True
            self._wait("request head")
        # A head still incomplete after this read: count all of it (the parser buffers a
        # header line until its end, so the callbacks alone would not see an endless one).
        if self._reading_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._head_too_large = True
                self.send_400_response("")
        self._sync_deadline()

    def send_400_response(self, msg: str) -> None:
        if self._head_too_large:
            detail = f"request head over {self.limits.max_header_bytes} bytes"
            self._close("431 Request Header Fields Too Large", detail)
        else:
            super().send_400_response(msg)

    # --- parser callbacks (all within data_received) --------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if not self._reading_head:  # a connection's first request keeps its connect deadline
            self._reading_head = True
            self._wait("request head")

    def on_headers_complete(self) -> None:
        # A head whole in one read is measured here, before the app would start.
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.limits.max_header_bytes:
            self._head_too_large = True
            raise ValueError("request head too large")  # ends the parse: send_400_response
        super().on_headers_complete()
        self._reading_head = False
        self._send_waited = 0.0  # each request's answer has its own send deadline
        if self.pipeline and any(cycle is self.cycle for cycle, _ in self.pipeline):
            self._waiting = None  # waits its turn with reading paused: not the client's delay
        else:
            self._wait("request body")

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._waiting = None

    def on_response_complete(self) -> None:  # from the app's task, not within a read
        super().on_response_complete()
        if self.cycle is not None and self.cycle.more_body and not self.cycle.response_complete:
            self._wait("request body")  # a pipelined request's turn
            self._sync_deadline()

    # --- deadlines ------------------------------------------------------------------------------

    def _wait(self, what: str) -> None:
        self._waiting, self._waiting_since = what, self.loop.time()

    def _sync_deadline(self) -> None:
        """Set, keep or cancel the timer for what the connection now waits for."""
        wanted = None if self._waiting is None else (self._waiting, self._waiting_since)
        if wanted == self._armed:
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._armed = wanted
        if wanted is not None:
            what, since = wanted
            seconds = (
                self.limits.header_timeout_s
                if what == "request head"
                else self.limits.body_timeout_s
            )
            self._deadline = self.loop.call_at(since + seconds, self._expired, what, seconds)

    def _expired(self, what: str, seconds: float) -> None:
        self._deadline = self._armed = None
        self._close("408 Request Timeout", f"{what} not received within {seconds:g} s")

    def _close(self, status: str, detail: str) -> None:
        self._waiting = None
        self._sync_deadline()
        if self.transport.is_closing():
            return
        _closed.add(detail, self.loop.time())
        if self._unanswered():
            self.transport.write(_answer(status, detail))
        self.transport.close()

    def _between_requests(self) -> bool:
        return (
            not self.transport.is_closing()
            and not self._reading_head
            and (self.cycle is None or self.cycle.response_complete)
        )

    def _unanswered(self) -> bool:
        """No response is on its way for the request being read (so an answer can be sent)."""
        if self.cycle is None:
            return True
        if self._reading_head:  # self.cycle is the previous request's
            return self.cycle.response_complete
        return not self.cycle.response_started


def bounded_protocol(limits: ConnectionLimits) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for uvicorn's `http=`, with these limits."""
    return type("BoundedHttpToolsProtocol", (BoundedHttpToolsProtocol,), {"limits": limits})
