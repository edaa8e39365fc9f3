"""Wall p50 and CPU per call of one warm slot, for an A/B of two whole trees.

scripts/jail_ab.py compares two copies of sandbox_service/jail under the same worker code; a
change that spans the worker's side too (the policy, the cgroups) needs each tree's own. Run
this once per tree, alternating, from each tree's root:

    PYTHONPATH=. /path/to/.venv/bin/python scripts/warm_slot_cost.py [--slot 5]

With --zygote lean, the slot's lean zygote and `print(1)` alone (math, data: both workloads).
Prints one JSON line: for `print(1)` and a sympy `solve`, the p50 of back-to-back calls, the
jail's CPU per call (nsjail's tree, the zygote and the programs it reaped, from /proc) and the
caller's. Needs root, like the workers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import psutil

from sandbox_service.execution import ExecutionSpec, Limits, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.jail.inside.heap import ZYGOTES
from sandbox_service.settings import Settings

WORKLOADS = (
    ("print", "print(1)", 300),
    (
        "sympy",
        "from sympy import symbols, solve\nx = symbols('x')\nprint(solve(x**2 - 4*x + 3, x))",
        100,
    ),
)


def jail_cpu_s() -> float:
    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--slot", type=int, default=5)
    parser.add_argument("--warm-up", type=int, default=20)
    parser.add_argument(
        "--zygote",
        choices=ZYGOTES,
        default="data",
        help="which of a slot's zygotes (jail/zygotes.py); lean: print only",
    )
    parser.add_argument("--cgroup-parent", default="rl-sandbox-ab")
    args = parser.parse_args()
    settings = Settings(cgroup_parent=args.cgroup_parent, idle_warm_up="never")
    executor = JailExecutor(settings, slot=args.slot, mode="warm", zygote=args.zygote)
    numbers = {}
    try:
        for name, code, calls in WORKLOADS[:1] if args.zygote == "lean" else WORKLOADS:
            spec = ExecutionSpec(code=code, limits=Limits(timeout_s=10))
            for _ in range(args.warm_up):
                executor.run(spec)
            walls = []
            jail_before, caller_before = jail_cpu_s(), time.process_time()
            for _ in range(calls):
                started = time.perf_counter()
                result = executor.run(spec)
                walls.append(time.perf_counter() - started)
                assert result.status == Status.OK, result
            numbers[name] = {
                "p50_ms": round(statistics.median(walls) * 1000, 2),
                "jail_cpu_ms": round((jail_cpu_s() - jail_before) / calls * 1000, 2),
                "caller_cpu_ms": round((time.process_time() - caller_before) / calls * 1000, 2),
            }
    finally:
        executor.close()
    print(json.dumps(numbers))


if __name__ == "__main__":
    main()
