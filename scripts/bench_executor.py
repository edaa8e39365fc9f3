"""Executor benchmark: latency and 2-core throughput of the jail, warm and cold, next to a fresh
unjailed `python -c` per call, all measured in one run (ratios, since machines are noisy).

Latency is measured two ways at concurrency 1: back to back (each call sent the moment the
last one is answered, so it also waits for the last run's teardown) and spaced (each call
after `--gap-ms` of idle time, as a call that finds an idle slot sees it).

    .venv/bin/python scripts/bench_executor.py [--calls 200] [--gap-ms 200] [--json out.json]

Needs root (nsjail, cgroups), like the workers. Talks to nothing but local processes.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from sandbox_service.execution import ExecutionSpec, Limits, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.settings import Settings

WORKLOADS = {
    "print(1)": "print(1)",
    "sympy solve": (
        "from sympy import symbols, solve\nx = symbols('x')\nprint(solve(x**2 - 4*x + 3, x))"
    ),
}
EXPECTED = {"print(1)": "1\n", "sympy solve": "[1, 3]\n"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(call: Callable[[], str], expected: str, calls: int, threads: int) -> dict[str, float]:
    """Run `calls` calls spread over `threads` threads; latencies and throughput."""
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()
    per_thread = calls // threads

    def loop() -> None:
        nonlocal failures
        for _ in range(per_thread):
            started = time.perf_counter()
            out = call()
            elapsed = time.perf_counter() - started
            with lock:
                latencies.append(elapsed)
                failures += out != expected

    started = time.perf_counter()
    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    total = time.perf_counter() - started
    return {
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 2),
        "throughput_per_s": round(len(latencies) / total, 1),
        "failures": failures,
    }


def measure_spaced(
    call: Callable[[], str], expected: str, calls: int, gap_s: float
) -> dict[str, float]:
    """Latency of calls made one at a time, each after `gap_s` of idle time."""
    latencies: list[float] = []
    failures = 0
    for _ in range(calls):
        time.sleep(gap_s)
        started = time.perf_counter()
        failures += call() != expected
        latencies.append(time.perf_counter() - started)
    return {
        "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
        "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
        "gap_ms": round(gap_s * 1000),
        "failures": failures,
    }


def baseline_call(code: str) -> Callable[[], str]:
    def call() -> str:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=False
        ).stdout

    return call


def jail_call(executors: dict[int, JailExecutor], code: str) -> Callable[[], str]:
    idle: queue.SimpleQueue[JailExecutor] = queue.SimpleQueue()
    for ex in executors.values():
        idle.put(ex)

    def call() -> str:
        ex = idle.get()
        try:
            result = ex.run(ExecutionSpec(code=code, limits=Limits(timeout_s=30)))
        finally:
            idle.put(ex)
        return result.stdout if result.status == Status.OK else f"<{result.status}>"

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per workload and mode")
    parser.add_argument("--threads", type=int, default=2, help="concurrent callers (cores)")
    parser.add_argument("--gap-ms", type=float, default=200, help="idle time before spaced calls")
    parser.add_argument("--spaced-calls", type=int, default=30, help="spaced calls per workload")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    settings = Settings(cgroup_parent="rl-sandbox-bench")
    rows = []
    for mode in ("warm", "cold", "baseline"):
        if mode == "baseline":
            executors: dict[int, JailExecutor] = {}
        else:
            executors = {i: JailExecutor(settings, slot=20 + i, mode=mode) for i in range(2)}
        try:
            for name, code in WORKLOADS.items():
                calls = args.calls if mode == "warm" else max(args.calls // 4, 20)
                make = baseline_call if mode == "baseline" else None
                call = make(code) if make else jail_call(executors, code)
                call()  # one untimed call: first-use costs of this process
                solo = measure(call, EXPECTED[name], max(calls // 2, 10), threads=1)
                spaced = measure_spaced(call, EXPECTED[name], args.spaced_calls, args.gap_ms / 1000)
                loaded = measure(call, EXPECTED[name], calls, threads=args.threads)
                rows.append(
                    {
                        "mode": mode,
                        "workload": name,
                        "concurrency_1": solo,
                        "spaced": spaced,
                        f"concurrency_{args.threads}": loaded,
                    }
                )
                failures = solo["failures"] + spaced["failures"] + loaded["failures"]
                print(
                    f"{mode:9} {name:12} c=1 p50 {solo['p50_ms']:7.2f} ms"
                    f"  p99 {solo['p99_ms']:7.2f} ms | spaced p50 {spaced['p50_ms']:7.2f} ms"
                    f"  p99 {spaced['p99_ms']:7.2f} ms | c={args.threads}"
                    f" {loaded['throughput_per_s']:7.1f}/s  p50 {loaded['p50_ms']:7.2f} ms"
                    f"  failures {failures}",
                    flush=True,
                )
        finally:
            for ex in executors.values():
                ex.close()
    base = {
        r["workload"]: r[f"concurrency_{args.threads}"]["throughput_per_s"]
        for r in rows
        if r["mode"] == "baseline"
    }
    for r in rows:
        if r["mode"] != "baseline":
            ratio = r[f"concurrency_{args.threads}"]["throughput_per_s"] / base[r["workload"]]
            r["throughput_vs_baseline"] = round(ratio, 2)
            print(f"{r['mode']:9} {r['workload']:12} throughput = {ratio:.1f}x fresh python -c")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
