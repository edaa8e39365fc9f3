"""The benchmark's HTTP client: one keep-alive HTTP/1.1 connection per simulated caller.

Not httpx: on a 2-core machine the load generator competes with the service for the same cores,
so it should cost as little CPU as possible (the whole bench process, JSON and checks included,
spends about 0.35 ms per call here). It speaks only what the benchmark needs: POST or
GET with a JSON body, replies with Content-Length (all the API sends). Loopback targets only.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class NotLoopback(ValueError):
    """The benchmark refuses to load anything but this machine's loopback interface."""


def loopback_target(url: str) -> tuple[str, int]:
    """(host, port) of an http:// URL on loopback; NotLoopback for anything else."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise NotLoopback(f"{url!r}: only plain http:// URLs on loopback are benchmarked")
    host = parts.hostname
    if host.lower() not in LOOPBACK_NAMES:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise NotLoopback(f"{url!r} is not on loopback (127.0.0.0/8, ::1, localhost)")
    return host, parts.port or 80


class Connection:
    """A keep-alive HTTP/1.1 connection; reconnects on the next call after an error."""

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """(HTTP status, body) of one request; OSError or IncompleteReadError when it breaks."""
        try:
            return await self._request(method, path, body)
        except BaseException:
            self.close()
            raise

    async def _request(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
            sock = self._writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        assert self._reader is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self._host}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        self._writer.write(head + body)
        status_line = await self._reader.readline()
        if not status_line:
            raise asyncio.IncompleteReadError(b"", None)
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self._reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self._reader.readexactly(length)

    def close(self) -> None:
        """Close the connection (the next request opens a new one)."""
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
