"""The server CPU per request that the API's connection rules (api/connections.py) add.

Serves a trivial ASGI app twice, under uvicorn's httptools protocol and under the bounded one,
each in its own process, and sends both the same keep-alive POSTs in alternating rounds; prints
each server's CPU microseconds per request (process CPU time, so a busy machine slows the rounds
but not the measure).

    .venv/bin/python scripts/connection_overhead.py [--rounds 10] [--requests 16000]

Needs no Redis, no worker and no root.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import time
from typing import Any

import psutil
import uvicorn

from sandbox_service.api.connections import ConnectionLimits, bounded_protocol

CONNECTIONS = 16
REQUEST = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n" + b"x" * 20


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the body, answers `ok`."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


def serve(kind: str, port: int) -> None:
    http: Any = "httptools" if kind == "httptools" else bounded_protocol(ConnectionLimits())
    uvicorn.run(app, host="127.0.0.1", port=port, http=http, ws="none", log_level="error")


async def one_connection(port: int, requests: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(requests):
        writer.write(REQUEST)
        await reader.readuntil(b"ok")
    writer.close()


async def load(port: int, requests: int) -> None:
    per_connection = requests // CONNECTIONS
    await asyncio.gather(*(one_connection(port, per_connection) for _ in range(CONNECTIONS)))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=16000)
    args = parser.parse_args()
    ports = {kind: free_port() for kind in ("httptools", "bounded")}
    servers = {
        kind: multiprocessing.Process(target=serve, args=(kind, port), daemon=True)
        for kind, port in ports.items()
    }
    for server in servers.values():
        server.start()
    time.sleep(3)
    cpu_us: dict[str, list[float]] = {kind: [] for kind in ports}
    for round_index in range(args.rounds):
        kinds = list(ports) if round_index % 2 else list(ports)[::-1]
        for kind in kinds:
            process = psutil.Process(servers[kind].pid)
            before = sum(process.cpu_times()[:2])
            asyncio.run(load(ports[kind], args.requests))
            spent = sum(process.cpu_times()[:2]) - before
            cpu_us[kind].append(spent / args.requests * 1e6)
    for kind, values in cpu_us.items():
        values.sort()
        shown = ", ".join(f"{v:.1f}" for v in values)
        print(
            f"{kind}: median {values[len(values) // 2]:.1f} us of server CPU per request ({shown})"
        )
    for server in servers.values():
        server.terminate()


if __name__ == "__main__":
    main()
