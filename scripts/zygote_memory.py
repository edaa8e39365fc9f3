"""What a zygote charges to its own cgroup: the figure under its hard memory limit.

Starts a warm slot and a session jail, and reports for each the zygote's resident size once
preloaded (what its limit is computed from) and the zygote cgroup's peak charge after a
workload: --calls plain runs (print and a sympy solve, alternating), then runs that take and
return files of --file-mb, or for the session
--forks forks of n = 8 with a cell in every member and a file in its scratch.

    .venv/bin/python scripts/zygote_memory.py [--calls 300] [--forks 4] [--file-mb 16]

Needs root (nsjail, cgroups), like the workers.
"""

from __future__ import annotations

import argparse
import os

from sandbox_service.execution import ExecutionSpec, Limits
from sandbox_service.jail import JailExecutor
from sandbox_service.jail.cgroups import SlotCgroups
from sandbox_service.jail.sessions import SessionPool
from sandbox_service.jail.zygote_jail import _resident_bytes
from sandbox_service.settings import Settings

SYMPY = "from sympy import symbols, solve\nx = symbols('x')\nprint(solve(x**2 - 4*x + 3, x))"
MIB = 1 << 20


def peak_mib(cgroups: SlotCgroups) -> float:
    zygote = cgroups.run_dirs[0].parent / "zygote"
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        if (zygote / name).exists():
            return int((zygote / name).read_text()) / MIB
    return cgroups.zygote_memory_bytes() / MIB


def limit_mib(cgroups: SlotCgroups) -> float:
    zygote = cgroups.run_dirs[0].parent / "zygote"
    for name in ("memory.max", "memory.limit_in_bytes"):
        if (zygote / name).exists():
            return int((zygote / name).read_text()) / MIB
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--forks", type=int, default=4)
    parser.add_argument("--file-mb", type=int, default=16, help="the file fetched (half in)")
    args = parser.parse_args()
    settings = Settings(cgroup_parent="rl-sandbox-zygote-memory", max_sessions_per_worker=64)
    limits = Limits(timeout_s=10.0, memory_mb=512, max_processes=64)

    ex = JailExecutor(settings, slot=60, mode="warm")
    try:
        ex.run(ExecutionSpec(code="print(1)", limits=limits))
        jail = ex._jail
        assert jail is not None
        resident = _resident_bytes(jail.zygote_pid) / MIB
        for i in range(args.calls):
            ex.run(ExecutionSpec(code=SYMPY if i % 2 else "print(1)", limits=limits))
        print(
            f"warm slot: resident {resident:.0f} MiB once preloaded, zygote cgroup peak "
            f"{peak_mib(jail.cgroups):.1f} MiB after {args.calls} runs "
            f"(limit {limit_mib(jail.cgroups):.0f} MiB)"
        )
        big = ExecutionSpec(
            code="open('out.bin', 'wb').write(open('in.bin', 'rb').read() * 2)",
            files={"in.bin": os.urandom(args.file_mb << 19)},
            fetch_files=("out.bin",),
            limits=limits,
        )
        for _ in range(3):
            ex.run(big)
        print(
            f"warm slot: zygote cgroup peak {peak_mib(jail.cgroups):.1f} MiB after 3 runs with a "
            f"{args.file_mb / 2:.0f} MiB input file and a {args.file_mb} MiB file fetched"
        )
    finally:
        ex.close()

    pool = SessionPool(settings, slot=61, spares=0)
    try:
        cell = "import numpy as np\nx = np.arange(1000)\nopen('f', 'wb').write(bytes(1 << 20))"
        pool.run_cell("s", ExecutionSpec(code=cell, limits=limits))
        live = pool._live["s"]
        resident = _resident_bytes(live.jail.zygote_pid) / MIB
        members = ["s"]
        for round_ in range(args.forks):
            forks = [f"s{round_}-{i}" for i in range(8)]
            pool.fork(members[-1], forks)
            members += forks
            for member in members:
                pool.run_cell(member, ExecutionSpec(code="x.sum()", limits=limits))
        print(
            f"session jail: resident {resident:.0f} MiB once preloaded, zygote cgroup peak "
            f"{peak_mib(live.cgroups):.1f} MiB after {args.forks} forks of 8 "
            f"({len(members)} members, a cell in each after every fork)"
        )
    finally:
        pool.close()


if __name__ == "__main__":
    main()
