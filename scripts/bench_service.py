#!/usr/bin/env python3
"""End-to-end benchmark of the service, next to a fresh unjailed `python -c` per call.

Starts `rl-sandbox up` on a free loopback port with a private Redis (or uses --url), then, for
`print(1)` and a sympy `solve`, runs a closed loop at each concurrency (default 1, 64, 1024) and
reports throughput, p50, p99 and failures (any non-200 or any status other than `ok`, or wrong
stdout). The baseline spawns `python -c CODE` per call at concurrency 1 and at the core count (its
best throughput). The client is a minimal keep-alive HTTP/1.1 client on asyncio, so that on a small
machine it takes as little CPU from the server as possible.

    .venv/bin/python scripts/bench_service.py [--url URL] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

WORKLOADS = {
    "print(1)": ("print(1)", "1\n"),
    "sympy solve": (
        "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 2*x - 3, x))",
        "[-1, 3]\n",
    ),
}


@dataclass
class Run:
    """One measured scenario."""

    name: str
    concurrency: int
    latencies_s: list[float] = field(default_factory=list)
    failures: int = 0
    elapsed_s: float = 0.0
    first_failure: str = ""

    def row(self) -> dict[str, object]:
        lat = sorted(self.latencies_s)
        n = len(lat)

        def pct(p: float) -> float:
            return lat[min(n - 1, int(p * n))] * 1000 if n else float("nan")

        return {
            "scenario": self.name,
            "concurrency": self.concurrency,
            "calls": n,
            "failed": self.failures,
            "calls_per_s": round(n / self.elapsed_s, 1) if self.elapsed_s else 0.0,
            "p50_ms": round(pct(0.50), 2),
            "p99_ms": round(pct(0.99), 2),
        }


class Connection:
    """A keep-alive HTTP/1.1 connection that POSTs JSON and reads Content-Length bodies."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def service_run(
    host: str, port: int, name: str, code: str, expect: str, concurrency: int, calls: int
) -> Run:
    run = Run(f"service {name}", concurrency)
    body = json.dumps({"code": code, "timeout": 30}).encode()
    remaining = calls

    async def client() -> None:
        nonlocal remaining
        conn = Connection(host, port)
        try:
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                try:
                    status, raw = await conn.post("/execute", body)
                    result = json.loads(raw) if status == 200 else {}
                    ok = result.get("status") == "ok" and result.get("stdout") == expect
                    if not ok and not run.first_failure:
                        run.first_failure = f"HTTP {status}: {raw[:300]!r}"
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    ok = False
                    run.first_failure = run.first_failure or repr(exc)
                    conn.close()
                    conn = Connection(host, port)
                run.latencies_s.append(time.perf_counter() - started)
                run.failures += not ok
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    run.elapsed_s = time.perf_counter() - started
    return run


async def baseline_run(name: str, code: str, expect: str, concurrency: int, calls: int) -> Run:
    run = Run(f"python -c {name}", concurrency)
    remaining = calls

    async def one() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            out, _ = await proc.communicate()
            run.latencies_s.append(time.perf_counter() - started)
            run.failures += proc.returncode != 0 or out.decode() != expect

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(concurrency)))
    run.elapsed_s = time.perf_counter() - started
    return run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"{url} not ready after {timeout_s}s")


def start_stack(port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "RL_SANDBOX_REDIS_URL")}
    env.setdefault("RL_SANDBOX_LOG_LEVEL", "WARNING")
    env.setdefault("RL_SANDBOX_MAX_QUEUE_DEPTH", "100000")
    argv = [sys.executable, "-m", "sandbox_service.cli", "up", "--port", str(port)]
    return subprocess.Popen(argv, env=env, start_new_session=True)


async def main_async(args: argparse.Namespace, host: str, port: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    cores = os.cpu_count() or 1
    scale = 0.25 if args.quick else 1.0
    for name, (code, expect) in WORKLOADS.items():
        heavy = name != "print(1)"
        for concurrency in args.concurrency:
            calls = max(concurrency, int((300 if concurrency == 1 else 4 * concurrency) * scale))
            if heavy:
                calls = max(concurrency, calls // 2)
            await service_run(host, port, name, code, expect, min(concurrency, 8), 16)  # warm-up
            run = await service_run(host, port, name, code, expect, concurrency, calls)
            rows.append(run.row())
            print(json.dumps(rows[-1]), flush=True)
            if run.first_failure:
                print(f"  first failure: {run.first_failure}", flush=True)
        for concurrency in sorted({1, cores}):
            calls = max(concurrency, int((60 if heavy else 150) * scale))
            run = await baseline_run(name, code, expect, concurrency, calls)
            rows.append(run.row())
            print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict[str, object]]) -> str:
    cols = ["scenario", "concurrency", "calls", "failed", "calls_per_s", "p50_ms", "p99_ms"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an already running service (default: start `rl-sandbox up`)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--quick", action="store_true", help="a quarter of the calls")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    stack = None
    if args.url:
        url = args.url.rstrip("/")
    else:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        stack = start_stack(port)
    try:
        wait_ready(url, 120)
        host, _, port_text = url.removeprefix("http://").partition(":")
        rows = asyncio.run(main_async(args, host, int(port_text or 80)))
    finally:
        if stack is not None:
            os.killpg(stack.pid, signal.SIGTERM)
            stack.wait(timeout=120)
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
