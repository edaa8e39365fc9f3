"""`rl-sandbox bench`: a concurrency sweep of the service next to fresh `python -c`, in one run.

For each workload (bench_workloads.py) and each concurrency, a closed loop of callers (one
keep-alive connection each) runs for a bounded time against the service; every result is checked
(status and each call's own output, not only the HTTP code). In the same run the baseline spawns a
fresh unjailed `python -c CODE` per call at concurrency 1 and at the core count. Machines are
noisy, so the report carries ratios measured side by side, the load average at every point, the
CPU milliseconds each component spent per call, and the API's memory (RSS) during each point.

The service is the one at --url (loopback only), or a private `rl-sandbox up` that the bench
starts on a free loopback port and stops at the end (its processes are then sampled too).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandbox_service import procs
from sandbox_service.bench_http import Connection, loopback_target
from sandbox_service.bench_procs import StackSampler
from sandbox_service.bench_report import Progress, plot, ratios, table
from sandbox_service.bench_workloads import WORKLOADS, Workload

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = (1, 4, 16, 64, 256, 1024)
BENCH_ENV = {
    "RL_SANDBOX_LOG_LEVEL": "WARNING",
    "RL_SANDBOX_MAX_QUEUE_DEPTH": "100000",
    "RL_SANDBOX_QUEUE_NAME": "rl-sandbox-bench",
    "RL_SANDBOX_CGROUP_PARENT": "rl-sandbox-bench",
    "RL_SANDBOX_SANDBOX_UID_BASE": "64000",
}
"""Settings of the private stack (unless set in the environment): quiet, a queue deep enough for
the largest sweep, and jail uids and cgroups of its own beside any other service on the host."""


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What one `rl-sandbox bench` run measures."""

    workloads: tuple[str, ...] = ("print", "sympy")
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    point_s: float = 8.0
    """Each point issues calls for this long (at least one call per caller), then drains."""
    max_calls: int = 20000
    """Upper bound of the calls of one point."""
    baseline: bool = True
    baseline_point_s: float = 6.0
    url: str | None = None
    workers: int | None = None
    """Worker processes of the private stack (default: one per core)."""
    timeout_s: float = 10.0
    """Program time limit sent with every call."""
    batch: int = 1
    """Calls per HTTP request: 1 posts /execute, more post /execute/batch (as trainer_client's
    micro-batching does); latencies are then those of whole batches."""
    progress: bool = True


@dataclass(slots=True)
class Point:
    """One measured (target, workload, concurrency)."""

    target: str
    """`service` or `baseline` (fresh `python -c` per call, no jail)."""
    workload: str
    concurrency: int
    batch: int = 1
    """Calls per request."""
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


async def baseline_point(point: Point, workload: Workload, point_s: float) -> None:
    """Measure one closed-loop point of fresh `python -c CODE` processes (no jail) into `point`."""
    loop = Caller(10**6, point_s)

    async def caller() -> None:
        first = True
        while (i := loop.take(first)) is not None:
            first = False
            started = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", workload.code(i),
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

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(point.concurrency)))
    point.elapsed_s = time.perf_counter() - started


async def measure(
    url: str, options: BenchOptions, sampler: StackSampler | None, progress: Progress
) -> list[Point]:
    """Every point of the run: for each workload, the service sweep, then the baseline."""
    host, port = loopback_target(url)
    cores = os.cpu_count() or 1
    points: list[Point] = []
    for name in options.workloads:
        workload = WORKLOADS[name]
        warmup = Point("service", name, 2 * cores)
        await progress.track(
            f"warm-up {name}",
            warmup,
            service_point(warmup, host, port, workload, 0.0, 0, options.timeout_s),
        )
        for concurrency in options.concurrency:
            point = Point("service", name, concurrency, options.batch)
            if sampler is not None:
                sampler.start()
            await progress.track(
                f"service {name} c={concurrency}",
                point,
                service_point(
                    point,
                    host,
                    port,
                    workload,
                    options.point_s,
                    options.max_calls,
                    options.timeout_s,
                ),
            )
            if sampler is not None:
                calls = len(point.latencies_s) * point.batch
                point.cpu_ms_per_call, point.rss_mb = await sampler.stop(calls)
            points.append(_stamped(point))
        if options.baseline:
            for concurrency in sorted({1, cores}):
                point = Point("baseline", name, concurrency)
                await progress.track(
                    f"python -c {name} c={concurrency}",
                    point,
                    baseline_point(point, workload, options.baseline_point_s),
                )
                points.append(_stamped(point))
    return points


def _stamped(point: Point) -> Point:
    point.load_avg_1m = round(os.getloadavg()[0], 2)
    return point


def run_bench(options: BenchOptions, out_dir: Path) -> dict[str, Any]:
    """Run the sweep (starting a private stack unless options.url), write the report and plot."""
    for name in options.workloads:
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    stack = None
    sampler: StackSampler | None = None
    total = len(options.workloads) * (1 + len(options.concurrency))
    if options.baseline:
        total += len(options.workloads) * len({1, os.cpu_count() or 1})
    progress = Progress(total, enabled=options.progress)
    load_before = os.getloadavg()
    started = time.time()
    if options.url is None:
        port = procs.free_port()
        url = f"http://127.0.0.1:{port}"
        stack = start_private_stack(port, options.workers)
        sampler = StackSampler.of_stack(stack.pid)
    else:
        url = options.url.rstrip("/")
        loopback_target(url)
        sampler = StackSampler.of_listener(loopback_target(url)[1])
    try:
        wait_ready(url, 120.0, stack)
        if sampler is not None:
            sampler.refresh()
        points = asyncio.run(measure(url, options, sampler, progress))
    finally:
        progress.close()
        if stack is not None:
            procs.stop([stack], grace_s=60.0)
    rows = [p.row() for p in points]
    report: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "url": url if options.url else "private `rl-sandbox up` on loopback",
        "cores": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "options": {k: v for k, v in asdict(options).items() if k != "progress"},
        "points": rows,
        "ratios": ratios(rows),
    }
    text = json.dumps(report, indent=1)
    report = json.loads(text)  # the report as its readers see it (lists, not tuples)
    (out_dir / "bench.json").write_text(text + "\n")
    (out_dir / "bench.md").write_text(table(report) + "\n")
    report["plot"] = str(out_dir / "bench.png") if plot(report, out_dir / "bench.png") else None
    return report


def start_private_stack(port: int, workers: int | None) -> subprocess.Popen[bytes]:
    """`rl-sandbox up` on 127.0.0.1:port with BENCH_ENV, as a child that dies with us."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "RL_SANDBOX_REDIS_URL")}
    for key, value in BENCH_ENV.items():
        env.setdefault(key, value)
    argv = [sys.executable, "-m", "sandbox_service.cli", "up", "--port", str(port)]
    if workers is not None:
        argv += ["--workers", str(workers)]
    # Its banner goes nowhere (it would break the progress bar); its logs stay on stderr.
    return procs.spawn(argv, env, stdout=subprocess.DEVNULL)


def wait_ready(url: str, timeout_s: float, stack: subprocess.Popen[bytes] | None) -> None:
    """Wait until GET /readyz answers 200 (SystemExit if the stack dies or time runs out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stack is not None and stack.poll() is not None:
            raise SystemExit(f"the private stack exited with {stack.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready after {timeout_s:.0f} s")


def bench_command(args: Any) -> int:
    """`rl-sandbox bench`: run, print the table, say where the report is; 1 if any call failed."""
    options = BenchOptions(
        workloads=tuple(args.workloads.split(",")),
        concurrency=tuple(args.concurrency),
        point_s=args.point_s,
        max_calls=args.max_calls,
        baseline=not args.no_baseline,
        url=args.url,
        workers=args.workers,
        batch=args.batch,
        progress=not args.no_progress,
    )
    out_dir = Path(args.out)
    report = run_bench(options, out_dir)
    print(table(report))
    print(
        f"\nreport: {out_dir / 'bench.json'}, {out_dir / 'bench.md'}, plot: {out_dir / 'bench.png'}"
    )
    return 1 if any(r["failed"] for r in report["points"]) else 0
