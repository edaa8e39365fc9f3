"""What switching between the live forks of a session adds to a cell, in one session jail.

A session writes FILES files of SIZE bytes and is forked once; then cells alternate between
the parent and its fork (each switch: the siblings stopped, the last member's scratch mounts
moved aside and this member's moved back, inside/scratch.py), against as many cells on one
member (no switch). Prints the medians.

    .venv/bin/python scripts/fork_switch_cost.py [--files 20] [--size 4096] [--cells 20]

Needs what the jail tests need (nsjail, a delegated cgroup); no service.
"""

from __future__ import annotations

import argparse
import statistics
import time

from sandbox_service.execution import ExecutionSpec, Limits
from sandbox_service.jail.sessions import SessionPool
from sandbox_service.settings import Settings

LIMITS = Limits(timeout_s=10.0, memory_mb=512, max_processes=64, max_output_bytes=4096)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--cells", type=int, default=20)
    args = parser.parse_args()
    settings = Settings(
        cgroup_parent="rl-sandbox-bench", max_sessions_per_worker=4, session_ttl_s=60
    )
    pool = SessionPool(settings, slot=0, spares=0)
    probe = ExecutionSpec(code="len(os.listdir('.'))", limits=LIMITS)
    expected = f"{args.files}\n"

    def cell(session: str) -> float:
        started = time.perf_counter()
        outcome = pool.run_cell(session, probe)
        assert outcome.result.stdout == expected, outcome.result
        return time.perf_counter() - started

    try:
        setup = (
            f"import os\nfor i in range({args.files}):\n"
            f"    open(f'f{{i}}', 'wb').write(os.urandom({args.size}))"
        )
        assert pool.run_cell("parent", ExecutionSpec(code=setup, limits=LIMITS)).alive
        pool.fork("parent", ["fork"])
        same = statistics.median(cell("parent") for _ in range(args.cells))
        switching = statistics.median(
            cell(member) for _ in range(args.cells // 2) for member in ("fork", "parent")
        )
    finally:
        pool.close()
    print(
        f"{args.files} files of {args.size} B: one member p50 {same * 1000:.1f} ms, "
        f"alternating p50 {switching * 1000:.1f} ms (a switch adds "
        f"{(switching - same) * 1000:.1f} ms)"
    )


if __name__ == "__main__":
    main()
