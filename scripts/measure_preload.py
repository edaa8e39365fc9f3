"""What the warm zygote's preload costs and saves: its preload time and memory, and the spaced
latency of calls that use what it preloaded (print, sympy, scipy, a matplotlib plot).

    .venv/bin/python scripts/measure_preload.py [--calls 20] [--gap-ms 200]

Needs root (nsjail, cgroups), like the workers; serialise it with other jail users.
"""

from __future__ import annotations

import argparse
import statistics
import time

from sandbox_service.execution import ExecutionSpec, Limits, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.settings import Settings

WORKLOADS = {
    "print": "print(1)",
    "sympy solve": "from sympy import symbols, solve\nx = symbols('x')\nprint(solve(x**2 - 1, x))",
    "scipy brentq": (
        "from scipy import optimize\nprint(round(optimize.brentq(lambda x: x*x - 2, 0, 2), 6))"
    ),
    "plot": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('t')",
}


def zygote_memory_mib(pid: int) -> dict[str, int]:
    """RSS, PSS and private dirty pages of the zygote, from /proc/<pid>/smaps_rollup."""
    memory = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, *value = line.split()
            if key in ("Rss:", "Pss:", "Private_Dirty:"):
                memory[key[:-1]] = int(value[0]) // 1024
    return memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--gap-ms", type=float, default=200)
    args = parser.parse_args()
    executor = JailExecutor(Settings(cgroup_parent="rl-sandbox-preload"), slot=40, mode="warm")
    try:
        executor.run(ExecutionSpec(code="pass"))
        pid = executor.zygote_pid()
        jail = getattr(executor, "_jail", None)
        preload_s = getattr(jail, "preload_s", 0.0)
        print(f"preload {preload_s:.2f} s, zygote {zygote_memory_mib(pid) if pid else '?'} MiB")
        for name, code in WORKLOADS.items():
            latencies, displays, statuses = [], 0, set()
            for _ in range(args.calls):
                time.sleep(args.gap_ms / 1000)
                started = time.perf_counter()
                result = executor.run(ExecutionSpec(code=code, limits=Limits(timeout_s=30)))
                latencies.append(time.perf_counter() - started)
                displays += len(result.display)
                statuses.add(str(result.status))
            print(
                f"{name:13} p50 {statistics.median(latencies) * 1000:8.2f} ms"
                f"  min {min(latencies) * 1000:8.2f} ms  statuses {sorted(statuses)}"
                f"  displays {displays}"
                + (
                    ""
                    if statuses == {str(Status.OK)}
                    else f"  last stderr {result.stderr[-200:]!r}"
                )
            )
    finally:
        executor.close()


if __name__ == "__main__":
    main()
