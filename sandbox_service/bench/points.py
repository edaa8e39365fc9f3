"""The benchmark's measured points: closed loops of callers against the service or against fresh
interpreters (baseline.py), each call checked (see command.py)."""

from __future__ import annotations

import asyncio
import json
import resource
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox_service.bench.baseline import Baseline
from sandbox_service.bench.http import Connection
from sandbox_service.bench.workloads import Workload


@dataclass(slots=True)
class Point:
    """One measured (target, workload, concurrency)."""

    target: str
    """`service` or `baseline` (a fresh interpreter per call, no jail), or a round of either."""
    workload: str
    concurrency: int
    batch: int = 1
    """Calls per request."""
    baseline: str = ""
    """Which baseline (Baseline.name) a baseline point ran."""
    latencies_s: list[float] = field(default_factory=list)
    """One per request."""
    failed: int = 0
    first_failure: str = ""
    elapsed_s: float = 0.0
    load_avg_1m: float = 0.0
    cpu_ms_per_call: dict[str, float] = field(default_factory=dict)
    rss_mb: dict[str, dict[str, float]] = field(default_factory=dict)

    def fail(self, why: str) -> None:
        """Count a failed call, keeping the first reason."""
        self.failed += 1
        self.first_failure = self.first_failure or why

    def row(self) -> dict[str, Any]:
        """The JSON-ready summary of this point."""
        lat = sorted(self.latencies_s)
        calls = len(lat) * self.batch
        return {
            "target": self.target,
            "workload": self.workload,
            "baseline": self.baseline,
            "concurrency": self.concurrency,
            "batch": self.batch,
            "calls": calls,
            "failed": self.failed,
            "first_failure": self.first_failure,
            "calls_per_s": round(calls / self.elapsed_s, 2) if self.elapsed_s else 0.0,
            "p50_ms": round(_percentile(lat, 0.50) * 1000, 2),
            "p99_ms": round(_percentile(lat, 0.99) * 1000, 2),
            "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else float("nan"),
            "elapsed_s": round(self.elapsed_s, 2),
            "load_avg_1m": self.load_avg_1m,
            "cpu_ms_per_call": self.cpu_ms_per_call,
            "rss_mb": self.rss_mb,
        }


def _percentile(ordered: Sequence[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Caller:
    """The closed loop of a point: callers take call indices until the point's time is up."""

    def __init__(self, max_calls: int, point_s: float) -> None:
        self._remaining = max_calls
        self._deadline = time.monotonic() + point_s
        self._next = 0

    def take(self, first: bool, count: int = 1) -> int | None:
        """The index of the next call (of `count` consecutive ones), or None when the point is
        over (a caller's first request always runs, so that every caller is in flight at once)."""
        if self._remaining <= 0 or (not first and time.monotonic() > self._deadline):
            return None
        self._remaining -= count
        self._next += count
        return self._next - count


async def service_point(
    point: Point,
    host: str,
    port: int,
    workload: Workload,
    point_s: float,
    max_calls: int,
    timeout_s: float,
) -> None:
    """Measure one closed-loop point against the service into `point`."""
    batch = point.batch
    loop = Caller(max(point.concurrency * batch, max_calls), point_s)
    path = "/execute" if batch == 1 else "/execute/batch"

    def body(first_index: int) -> bytes:
        requests = [
            {"code": workload.code(i), "timeout": timeout_s}
            for i in range(first_index, first_index + batch)
        ]
        return json.dumps(requests[0] if batch == 1 else {"requests": requests}).encode()

    def check(first_index: int, status: int, raw: bytes) -> None:
        if status != 200:
            for _ in range(batch):
                point.fail(f"HTTP {status}: {raw[:200]!r}")
            return
        answer = json.loads(raw)
        results = [answer] if batch == 1 else answer["results"]
        for i, result in zip(range(first_index, first_index + batch), results, strict=True):
            problem = workload.check(i, result)
            if problem is not None:
                point.fail(problem)

    async def caller() -> None:
        conn = Connection(host, port)
        first = True
        try:
            while (i := loop.take(first, batch)) is not None:
                first = False
                data = body(i)
                started = time.perf_counter()
                try:
                    status, raw = await conn.request("POST", path, data)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    point.latencies_s.append(time.perf_counter() - started)
                    for _ in range(batch):
                        point.fail(f"connection: {exc!r}")
                    continue
                point.latencies_s.append(time.perf_counter() - started)
                check(i, status, raw)
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(point.concurrency)))
    point.elapsed_s = time.perf_counter() - started


async def baseline_point(
    point: Point, baseline: Baseline, workload: Workload, point_s: float
) -> None:
    """Measure one closed-loop point of fresh interpreters (no jail) into `point`, with their
    CPU per call (reaped children) and this process's (spawning and reading them)."""
    loop = Caller(10**6, point_s)

    async def caller() -> None:
        first = True
        while (i := loop.take(first)) is not None:
            first = False
            started = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                *baseline.argv, workload.code(i),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await proc.communicate()
            point.latencies_s.append(time.perf_counter() - started)
            result = {
                "status": "ok" if proc.returncode == 0 else "error",
                "exit_code": proc.returncode,
                "stdout": out.decode(errors="replace"),
                "stdout_truncated": False,
                "stderr": err.decode(errors="replace"),
            }
            problem = workload.check(i, result)
            if problem is not None:
                point.fail(problem)

    children, me = _cpu_s(resource.RUSAGE_CHILDREN), _cpu_s(resource.RUSAGE_SELF)
    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(point.concurrency)))
    point.elapsed_s = time.perf_counter() - started
    calls = max(len(point.latencies_s), 1)
    python_c = 1000 * (_cpu_s(resource.RUSAGE_CHILDREN) - children) / calls
    bench = 1000 * (_cpu_s(resource.RUSAGE_SELF) - me) / calls
    point.cpu_ms_per_call = {
        "interpreters": round(python_c, 3),
        "bench": round(bench, 3),
        "total": round(python_c, 3),
    }


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime
