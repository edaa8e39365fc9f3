"""`rl-sandbox bench`: a concurrency sweep of the service next to fresh interpreters, one run.

For each workload (workloads.py) and each concurrency, a closed loop of callers (one keep-alive
connection each) runs for a bounded time against the service; every result is checked (status
and each call's own output, not only the HTTP code). In the same run each fair baseline
(baseline.py: a plain venv's `python -c`, and `python -I -S -c` for programs that import only the
standard library) spawns a fresh unjailed interpreter per call at concurrency 1 and at the core
count. Machines are
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
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sandbox_service.bench.baseline import Baseline, baselines
from sandbox_service.bench.efficiency import efficiency
from sandbox_service.bench.http import loopback_target
from sandbox_service.bench.points import Point, baseline_point, service_point
from sandbox_service.bench.procs import StackSampler
from sandbox_service.bench.report import Progress, batching, plot, ratios, table
from sandbox_service.bench.workloads import WORKLOADS, Workload
from sandbox_service.local.private import PrivateService

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = (1, 4, 16, 64, 256, 1024)
BENCH_SETTINGS = {
    "log_level": "WARNING",
    "max_queue_depth": "100000",
    "queue_name": "rl-sandbox-bench",
    "cgroup_parent": "rl-sandbox-bench",
    "sandbox_uid_base": "64000",
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
    ratio_rounds: int = 3
    """After each workload's sweep: rounds of (service at its best concurrency, then the
    baseline at the core count), alternating, so that a ratio compares like with like on a
    machine whose load drifts; the median round is reported."""
    round_s: float = 4.0
    url: str | None = None
    workers: int | None = None
    """Worker processes of the private stack (default: one per core)."""
    timeout_s: float = 10.0
    """Program time limit sent with every call."""
    batch: int = 1
    """Calls per HTTP request: 1 posts /execute, more post /execute/batch (as trainer_client's
    micro-batching does); latencies are then those of whole batches."""
    compare_batch: int = 0
    """More than 1: each service point is measured again right after with this many calls per
    request, and the report compares the service path's CPU per call (API, workers, Redis:
    everything but the jail's own run) single against batched (report.batching)."""
    batch_rounds: int = 0
    """With compare_batch: after the sweep, this many alternating rounds of (single, batched)
    at each concurrency, round_s each, so that their ratio compares like with like on a
    machine whose load drifts; the median round is reported."""
    progress: bool = True


async def measure(
    url: str,
    options: BenchOptions,
    sampler: StackSampler | None,
    progress: Progress,
    fair: tuple[Baseline, ...],
) -> list[Point]:
    """Every point of the run: for each workload, the service sweep, then the baselines."""
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
            for batch in _batches(options):
                point = Point("service", name, concurrency, batch)
                label = f"service {name} c={concurrency} batch={batch}"
                await _sampled(
                    point, label, host, port, workload, options.point_s, options, sampler, progress
                )
                points.append(_stamped(point))
        points += await _batch_rounds(host, port, workload, options, sampler, progress)
        usable = _usable(fair, workload)
        for baseline in usable:
            for concurrency in sorted({1, cores}):
                point = Point("baseline", name, concurrency, baseline=baseline.name)
                await progress.track(
                    f"{baseline.name} {name} c={concurrency}",
                    point,
                    baseline_point(point, baseline, workload, options.baseline_point_s),
                )
                points.append(_stamped(point))
        if usable:
            points += await _ratio_rounds(
                host, port, workload, usable, points, options, sampler, progress
            )
    return points


def _batches(options: BenchOptions) -> tuple[int, ...]:
    if options.compare_batch > 1 and options.compare_batch != options.batch:
        return (options.batch, options.compare_batch)
    return (options.batch,)


async def _batch_rounds(
    host: str,
    port: int,
    workload: Workload,
    options: BenchOptions,
    sampler: StackSampler | None,
    progress: Progress,
) -> list[Point]:
    """Alternating single and batched rounds at each concurrency (BenchOptions.batch_rounds)."""
    if sampler is None or len(_batches(options)) < 2:
        return []
    rounds: list[Point] = []
    for concurrency in options.concurrency:
        for r in range(options.batch_rounds):
            for batch in _batches(options):
                point = Point("batch round", workload.name, concurrency, batch)
                label = f"round {r + 1} {workload.name} c={concurrency} batch={batch}"
                await _sampled(
                    point, label, host, port, workload, options.round_s, options, sampler, progress
                )
                rounds.append(_stamped(point))
    return rounds


async def _sampled(
    point: Point,
    label: str,
    host: str,
    port: int,
    workload: Workload,
    seconds: float,
    options: BenchOptions,
    sampler: StackSampler | None,
    progress: Progress,
) -> None:
    """Measure one service point for `seconds`, with the stack's CPU per call when sampled."""
    if sampler is not None:
        sampler.start()
    await progress.track(
        label,
        point,
        service_point(point, host, port, workload, seconds, options.max_calls, options.timeout_s),
    )
    if sampler is not None:
        calls = len(point.latencies_s) * point.batch
        point.cpu_ms_per_call, point.rss_mb = await sampler.stop(calls)


def _usable(fair: tuple[Baseline, ...], workload: Workload) -> tuple[Baseline, ...]:
    return tuple(b for b in fair if workload.stdlib_only or not b.stdlib_only)


async def _ratio_rounds(
    host: str,
    port: int,
    workload: Workload,
    fair: tuple[Baseline, ...],
    points: list[Point],
    options: BenchOptions,
    sampler: StackSampler | None,
    progress: Progress,
) -> list[Point]:
    """Alternating rounds of the service at its best concurrency, once per calls-per-request
    size (BenchOptions.compare_batch), each sampled for its CPU, and each baseline at the core
    count (see BenchOptions.ratio_rounds)."""
    sweep = [p for p in points if p.target == "service" and p.workload == workload.name]
    if not sweep or options.ratio_rounds <= 0:
        return []
    best = {
        batch: max(
            (p for p in sweep if p.batch == batch),
            key=lambda p: len(p.latencies_s) * p.batch / max(p.elapsed_s, 1e-9),
        ).concurrency
        for batch in _batches(options)
    }
    cores = os.cpu_count() or 1
    rounds: list[Point] = []
    for r in range(options.ratio_rounds):
        for batch, concurrency in best.items():
            service = Point("service round", workload.name, concurrency, batch)
            label = f"round {r + 1} service {workload.name} c={concurrency} batch={batch}"
            await _sampled(
                service, label, host, port, workload, options.round_s, options, sampler, progress
            )
            rounds.append(_stamped(service))
        for fresh in fair:
            baseline = Point("baseline round", workload.name, cores, baseline=fresh.name)
            await progress.track(
                f"round {r + 1} {fresh.name} {workload.name} c={cores}",
                baseline,
                baseline_point(baseline, fresh, workload, options.round_s),
            )
            rounds.append(_stamped(baseline))
    return rounds


def _stamped(point: Point) -> Point:
    point.load_avg_1m = round(os.getloadavg()[0], 2)
    return point


def run_bench(options: BenchOptions, out_dir: Path) -> dict[str, Any]:
    """Run the sweep (starting a private stack unless options.url), write the report and plot."""
    for name in options.workloads:
        if name not in WORKLOADS:
            raise SystemExit(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    _raise_open_files(2 * max(options.concurrency) + 256)
    stack: PrivateService | None = None
    sampler: StackSampler | None = None
    batches = len(_batches(options))
    total = len(options.workloads) * (1 + len(options.concurrency) * batches)
    if batches > 1:
        total += len(options.workloads) * len(options.concurrency) * 2 * options.batch_rounds
    if options.baseline:
        for name in options.workloads:
            kinds = 2 if WORKLOADS[name].stdlib_only else 1
            rounds = (batches + kinds) * options.ratio_rounds
            total += kinds * len({1, os.cpu_count() or 1}) + rounds
    fair = baselines() if options.baseline else ()
    progress = Progress(total, enabled=options.progress)
    load_before = os.getloadavg()
    started = time.time()
    if options.url is None:
        stack = private_stack(options.workers)
        try:
            stack.start()
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from exc
        url = stack.url
        sampler = StackSampler.of_stack(stack.pid)
    else:
        url = options.url.rstrip("/")
        sampler = StackSampler.of_listener(loopback_target(url)[1])
    try:
        if sampler is not None:
            sampler.refresh()
        points = asyncio.run(measure(url, options, sampler, progress, fair))
    finally:
        progress.close()
        if stack is not None:
            stack.stop()
    rows = [p.row() for p in points]
    report: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "url": url if options.url else "private `rl-sandbox up` on loopback",
        "cores": os.cpu_count(),
        "baselines": {b.name: list(b.argv) for b in fair},
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "options": {k: v for k, v in asdict(options).items() if k != "progress"},
        "points": rows,
        "ratios": ratios(rows),
        "batching": batching(rows),
        "efficiency": efficiency(rows),
    }
    text = json.dumps(report, indent=1)
    report = json.loads(text)  # the report as its readers see it (lists, not tuples)
    (out_dir / "bench.json").write_text(text + "\n")
    (out_dir / "bench.md").write_text(table(report) + "\n")
    report["plot"] = str(out_dir / "bench.png") if plot(report, out_dir / "bench.png") else None
    return report


def _raise_open_files(needed: int) -> None:
    # One socket per caller here, one per connection in a private API (which inherits the limit):
    # a common soft limit of 1,024 would fail a sweep to 1,024 callers.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SystemExit(
            f"this concurrency needs about {needed} open files; the limit is {hard}"
            " (raise it with `ulimit -n`)"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def private_stack(workers: int | None) -> PrivateService:
    """The bench's own `rl-sandbox up` (BENCH_SETTINGS unless set in our environment)."""
    return PrivateService(BENCH_SETTINGS, inherit_settings=True, workers=workers)


def bench_command(args: Any) -> int:
    """`rl-sandbox bench`: run, print the table, say where the report is; 1 if any call failed."""
    options = BenchOptions(
        workloads=tuple(args.workloads.split(",")),
        concurrency=tuple(args.concurrency),
        point_s=args.point_s,
        max_calls=args.max_calls,
        baseline=not args.no_baseline,
        ratio_rounds=args.ratio_rounds,
        round_s=args.round_s,
        url=args.url,
        workers=args.workers,
        batch=args.batch,
        compare_batch=args.compare_batch,
        batch_rounds=args.batch_rounds,
        progress=not args.no_progress,
    )
    out_dir = Path(args.out)
    report = run_bench(options, out_dir)
    print(table(report))
    print(
        f"\nreport: {out_dir / 'bench.json'}, {out_dir / 'bench.md'}, plot: {out_dir / 'bench.png'}"
    )
    return 1 if any(r["failed"] for r in report["points"]) else 0
