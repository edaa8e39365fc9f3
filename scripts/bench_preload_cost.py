"""What one module of the math preload costs: warm-call latency and the jail's CPU per call, the
zygote's preload time and its jail's memory at rest, with the preload as shipped against the
same preload less that module (a copy of jail/inside/ whose MATH_PRELOAD lacks it), in
alternating rounds on two warm slots.

    .venv/bin/python scripts/bench_preload_cost.py [--module pandas] [--calls 100] [--rounds 3]

Needs root (nsjail, cgroups), like the workers. Talks to nothing but local processes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from sandbox_service.execution import ExecutionSpec, Limits, Status
from sandbox_service.jail import JailExecutor, executor
from sandbox_service.settings import Settings

WORKLOADS = {
    "print(1)": ("print(1)", "1\n"),
    "sympy solve": (
        "from sympy import symbols, solve\nx = symbols('x')\nprint(solve(x**2 - 4*x + 3, x))",
        "[1, 3]\n",
    ),
    "pandas frame": (
        "import pandas as pd\nprint(pd.DataFrame({'a': [1, 2, 3]})['a'].sum())",
        "6\n",
    ),
}
LIMITS = Limits(timeout_s=30.0, memory_mb=1024)


def inside_without(module: str, into: Path) -> str:
    """A copy of jail/inside/ whose MATH_PRELOAD lacks `module`."""
    copy = into / "inside"
    shutil.copytree(executor.INSIDE_SOURCE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    heap = copy / "heap.py"
    text = heap.read_text()
    shipped = text.split("MATH_PRELOAD = ", 1)[1].split("\n", 1)[0]
    names = [n.strip().strip('"') for n in shipped.strip("()").split(",") if n.strip()]
    if module not in names:
        raise SystemExit(f"{module} is not in MATH_PRELOAD {names}")
    kept = "(" + ", ".join(f'"{n}"' for n in names if n != module) + ",)"
    heap.write_text(text.replace(f"MATH_PRELOAD = {shipped}", f"MATH_PRELOAD = {kept}", 1))
    return str(copy)


def jail_cpu_s(zygote_pid: int) -> float:
    """CPU of the zygote, the programs it reaped and its live children."""
    zygote = psutil.Process(zygote_pid)
    total = 0.0
    for proc in [zygote, *zygote.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def jail_memory_mib(zygote_pid: int) -> tuple[float, float]:
    """PSS and RSS (MiB) of the zygote and its children (the standby) at rest."""
    zygote = psutil.Process(zygote_pid)
    procs = [zygote, *zygote.children(recursive=True)]
    infos = [p.memory_full_info() for p in procs]
    return sum(i.pss for i in infos) / 2**20, sum(i.rss for i in infos) / 2**20


def measure(ex: JailExecutor, calls: int) -> dict[str, dict[str, float]]:
    zygote = ex._jail.zygote_pid if ex._jail is not None else 0
    rows: dict[str, dict[str, float]] = {}
    for name, (code, expected) in WORKLOADS.items():
        spec = ExecutionSpec(code=code, limits=LIMITS)
        walls: list[float] = []
        cpu_before = jail_cpu_s(zygote)
        for _ in range(calls):
            started = time.perf_counter()
            result = ex.run(spec)
            walls.append(time.perf_counter() - started)
            if result.status != Status.OK or result.stdout != expected:
                raise SystemExit(f"{name}: {result.status} {result.stdout!r} {result.stderr}")
        cpu = (jail_cpu_s(zygote) - cpu_before) / calls
        rows[name] = {"p50_ms": statistics.median(walls) * 1e3, "cpu_ms": cpu * 1e3}
    time.sleep(2.0)  # at rest: the standby forked, nothing running
    pss, rss = jail_memory_mib(zygote)
    rows["memory"] = {"pss_mib": pss, "rss_mib": rss}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", default="pandas", help="the preloaded module to price")
    parser.add_argument("--calls", type=int, default=100, help="calls per workload and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    settings = Settings(cgroup_parent="rl-sandbox-bench", idle_warm_up="never")
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        shipped_source = executor.INSIDE_SOURCE
        executor.INSIDE_SOURCE = inside_without(args.module, Path(tmp))
        try:
            without = JailExecutor(settings, slot=24, mode="warm")
        finally:
            executor.INSIDE_SOURCE = shipped_source
        shipped = JailExecutor(settings, slot=25, mode="warm")
        try:
            slots = {"shipped": shipped, f"without {args.module}": without}
            for ex in slots.values():  # start both jails (preload) before any round
                ex.run(ExecutionSpec(code="pass", limits=LIMITS))
            preload = {k: ex._jail.preload_s for k, ex in slots.items() if ex._jail}
            rounds: dict[str, list[dict[str, dict[str, float]]]] = {k: [] for k in slots}
            for _ in range(args.rounds):
                for key, ex in slots.items():
                    rounds[key].append(measure(ex, args.calls))
        finally:
            shipped.close()
            without.close()
    summary = {
        key: {
            row: {m: round(statistics.median(r[row][m] for r in runs), 2) for m in runs[0][row]}
            for row in runs[0]
        }
        for key, runs in rounds.items()
    }
    for key, rows in summary.items():
        print(f"{key}: preload {preload.get(key, 0.0):.2f} s")
        for row, values in rows.items():
            print(f"  {row:13} " + "  ".join(f"{m} {v}" for m, v in values.items()))
    if args.json:
        with open(args.json, "w") as f:
            out = {"summary": summary, "preload_s": preload, "load_avg": os.getloadavg()}
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
