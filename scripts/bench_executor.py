"""Executor benchmark: latency and 2-core throughput of the jail, warm and cold, next to the fair
baselines (a fresh unjailed interpreter per call from a plain venv with the same sympy and numpy,
and `python -I -S -c` for print; sandbox_service/bench/baseline.py), all in one run, with the CPU
each spends per call (ratios, since machines are noisy).

Latency is measured two ways at concurrency 1: back to back (each call sent the moment the
last one is answered, so it also waits for the last run's teardown) and spaced (each call
after `--gap-ms` of idle time, as a call that finds an idle slot sees it).

    .venv/bin/python scripts/bench_executor.py [--calls 200] [--gap-ms 200] [--json out.json]

Needs root (nsjail, cgroups), like the workers. Talks to nothing but local processes.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import threading
import time
from collections.abc import Callable

from sandbox_service.bench.baseline import Baseline, baselines
from sandbox_service.execution import ExecutionSpec, Limits, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.jail.zygotes import SlotExecutor, slot_executor
from sandbox_service.settings import Settings

WORKLOADS = {
    "print(1)": "print(1)",
    "sympy solve": (
        "from sympy import symbols, solve\nx = symbols('x')\nprint(solve(x**2 - 4*x + 3, x))"
    ),
}
EXPECTED = {"print(1)": "1\n", "sympy solve": "[1, 3]\n"}
STDLIB_ONLY = {"print(1)"}


def cpu_s() -> dict[str, float]:
    """CPU seconds of this process (all threads: the executors' side), of its reaped children
    (the baselines' interpreters), and of the live jails (zygotes and the programs they reaped)."""
    children = os.times()
    return {
        "bench": time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID),
        "interpreters": children.children_user + children.children_system,
        "jails": _jail_cpu_s(),
    }


def _jail_cpu_s() -> float:
    # The zygotes (and nsjail) are grandchildren: their CPU and that of the programs they
    # reaped reaches us only when a jail ends, so read it live from /proc.
    import psutil

    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(
    call: Callable[[], str], expected: str, calls: int, threads: int, jailed: bool
) -> dict[str, float]:
    """Run `calls` calls spread over `threads` threads; latencies, throughput, CPU per call."""
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

    cpu_before = cpu_s()
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
        **_cpu_per_call(cpu_before, cpu_s(), len(latencies), jailed),
        "failures": failures,
    }


def _cpu_per_call(
    before: dict[str, float], after: dict[str, float], calls: int, jailed: bool
) -> dict[str, float]:
    # A baseline's CPU is its interpreters' and the spawning's here. A jail's is the live
    # jails', their reaped nsjails' (cold mode) and the executors' here. The live warm jails
    # idle during a baseline: their idle warm-ups are not the baseline's.
    ms = {k: 1000 * (after[k] - before[k]) / max(calls, 1) for k in after}
    spent = ms["interpreters"] + (ms["jails"] if jailed else 0.0)
    return {
        "cpu_ms_per_call": round(ms["bench"] + spent, 2),
        "cpu_ms_caller": round(ms["bench"], 2),
        "cpu_ms_callee": round(spent, 2),
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


def baseline_call(baseline: Baseline, code: str) -> Callable[[], str]:
    def call() -> str:
        return subprocess.run(
            [*baseline.argv, code], capture_output=True, text=True, check=False
        ).stdout

    return call


def jail_call(executors: dict[int, SlotExecutor], code: str) -> Callable[[], str]:
    idle: queue.SimpleQueue[SlotExecutor] = queue.SimpleQueue()
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


def measure_mode(
    mode: str,
    call_of: Callable[[str], Callable[[], str]],
    names: list[str],
    args: argparse.Namespace,
) -> list[dict[str, object]]:
    """Every workload of one mode (a jail mode or a baseline): c=1, spaced, c=threads."""
    rows: list[dict[str, object]] = []
    jailed = mode in ("warm", "cold")
    for name in names:
        calls = args.calls if mode == "warm" else max(args.calls // 4, 20)
        call = call_of(WORKLOADS[name])
        call()  # one untimed call: first-use costs of this process
        solo = measure(call, EXPECTED[name], max(calls // 2, 10), 1, jailed)
        spaced = measure_spaced(call, EXPECTED[name], args.spaced_calls, args.gap_ms / 1000)
        loaded = measure(call, EXPECTED[name], calls, args.threads, jailed)
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
            f"{mode:13} {name:12} c=1 p50 {solo['p50_ms']:7.2f} ms"
            f" cpu {solo['cpu_ms_per_call']:6.2f} ms | spaced p50 {spaced['p50_ms']:7.2f} ms"
            f"  p99 {spaced['p99_ms']:7.2f} ms | c={args.threads}"
            f" {loaded['throughput_per_s']:7.1f}/s  p50 {loaded['p50_ms']:7.2f} ms"
            f" cpu {loaded['cpu_ms_per_call']:6.2f} ms  failures {failures}",
            flush=True,
        )
    return rows


def alternating_rounds(
    warm: Callable[[str], Callable[[], str]],
    fair: tuple[Baseline, ...],
    args: argparse.Namespace,
) -> list[dict[str, object]]:
    """Warm jails and each baseline in turn at `threads` callers; the median ratio per pair."""
    out: list[dict[str, object]] = []
    for name in WORKLOADS:
        usable = [b for b in fair if name in STDLIB_ONLY or not b.stdlib_only]
        service_call = warm(WORKLOADS[name])
        ratios: dict[str, list[float]] = {b.name: [] for b in usable}
        cpu: dict[str, list[float]] = {b.name: [] for b in usable}
        for _ in range(args.rounds):
            calls = args.round_calls if name in STDLIB_ONLY else args.round_calls // 4
            service = measure(service_call, EXPECTED[name], calls, args.threads, jailed=True)
            for b in usable:
                base_calls = max(calls // (4 if name in STDLIB_ONLY else 20), 2 * args.threads)
                call = baseline_call(b, WORKLOADS[name])
                base = measure(call, EXPECTED[name], base_calls, args.threads, jailed=False)
                ratios[b.name].append(service["throughput_per_s"] / base["throughput_per_s"])
                cpu[b.name].append(base["cpu_ms_per_call"] / max(service["cpu_ms_per_call"], 1e-9))
        for b in usable:
            row = {
                "workload": name,
                "baseline": b.name,
                "throughput_ratios": [round(x, 2) for x in ratios[b.name]],
                "throughput_ratio_median": round(statistics.median(ratios[b.name]), 2),
                "cpu_ratio_median": round(statistics.median(cpu[b.name]), 2),
            }
            out.append(row)
            print(
                f"rounds {name:12} warm vs {b.name:13}: throughput"
                f" {row['throughput_ratio_median']:6.2f}x (rounds {row['throughput_ratios']}),"
                f" CPU per call {row['cpu_ratio_median']:6.2f}x",
                flush=True,
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per workload and mode")
    parser.add_argument("--threads", type=int, default=2, help="concurrent callers (cores)")
    parser.add_argument("--gap-ms", type=float, default=200, help="idle time before spaced calls")
    parser.add_argument("--spaced-calls", type=int, default=30, help="spaced calls per workload")
    parser.add_argument("--rounds", type=int, default=3, help="alternating warm/baseline rounds")
    parser.add_argument("--round-calls", type=int, default=400, help="warm print calls per round")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold mode")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    settings = Settings(cgroup_parent="rl-sandbox-bench")
    fair = baselines()
    names = list(WORKLOADS)
    # A worker's slots: each with its zygotes chosen per program (jail/zygotes.py).
    warm = {i: slot_executor(settings, 20 + i) for i in range(2)}
    try:

        def warm_call(code: str) -> Callable[[], str]:
            return jail_call(warm, code)

        rows = measure_mode("warm", warm_call, names, args)
        if not args.no_cold:
            cold: dict[int, SlotExecutor] = {
                i: JailExecutor(settings, slot=22 + i, mode="cold") for i in range(2)
            }
            try:
                rows += measure_mode("cold", lambda code: jail_call(cold, code), names, args)
            finally:
                for ex in cold.values():
                    ex.close()
        for b in fair:

            def fresh(code: str, b: Baseline = b) -> Callable[[], str]:
                return baseline_call(b, code)

            usable = [n for n in names if n in STDLIB_ONLY or not b.stdlib_only]
            rows += measure_mode(b.name, fresh, usable, args)
        rounds = alternating_rounds(warm_call, fair, args)
    finally:
        for ex in warm.values():
            ex.close()
    key = f"concurrency_{args.threads}"
    for r in rows:
        if r["mode"] in ("warm", "cold"):
            for b in fair:
                base = next(
                    (x for x in rows if x["mode"] == b.name and x["workload"] == r["workload"]),
                    None,
                )
                if base is None:
                    continue
                mine, theirs = r[key], base[key]
                assert isinstance(mine, dict) and isinstance(theirs, dict)
                ratio = mine["throughput_per_s"] / theirs["throughput_per_s"]
                r[f"throughput_vs_{b.name}"] = round(ratio, 2)
                print(f"{r['mode']:5} {r['workload']:12} throughput = {ratio:5.1f}x {b.name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"modes": rows, "rounds": rounds, "load_avg": os.getloadavg()}, f, indent=2)


if __name__ == "__main__":
    main()
