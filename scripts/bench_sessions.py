#!/usr/bin/env python3
"""A 10-turn trajectory: total tool time with sessions versus replaying the history on each call.

Two ways to give a multi-turn agent notebook state, over the same ten cells (a sympy/numpy
exploration typical of math tool calls):

- `session`: each call sends only the new cell with a `session_id`; the interpreter keeps its
  state (turns after the first cost one cell each). The trajectory ends with DELETE.
- `replay`: the rStar2-Agent release's way: each call sends every earlier cell and the new one as
  one program (earlier cells' output suppressed), so call k re-runs k - 1 cells.

Both must print the same thing at every turn (checked). Reported per mode: tool time per
trajectory (sum of the ten calls' latencies, as the trainer waits for them), the first turn (a
new session waits for a jail unless a spare is ready), turns 2-10, the last turn, the server's run
time (sum of `wall_time`) and the CPU time (sum of `cpu_time`). Runs
`--trajectories` trajectories one after another, then `--concurrent` at once.

Starts `rl-sandbox up` on a free loopback port (private Redis), unless --url is given:

    .venv/bin/python scripts/bench_sessions.py [--url URL] [--trajectories 5] [--concurrent 8]
        [--session-spares 1]
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox_service.local.private import PrivateService

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field

import httpx

CELLS = [
    "import sympy as sp\nimport numpy as np\nx = sp.symbols('x')\nprint('ready')",
    "f = x**3 - 6*x**2 + 11*x - 6\nprint(sp.factor(f))",
    "roots = sp.solve(f, x)\nprint(roots)",
    "vals = np.array([float(r) for r in roots])\nprint(vals.sum(), vals.prod())",
    "g = sp.diff(f, x)\ncrit = sp.solve(g, x)\nprint([sp.N(c, 6) for c in crit])",
    "area = sp.integrate(f, (x, 1, 3))\nprint(area)",
    "primes = [k for k in range(2, 20000) if sp.isprime(k)]\nprint(len(primes))",
    "M = sp.Matrix([[2, 1], [1, 3]])\nprint(M.inv(), M.eigenvals())",
    "series = sp.series(sp.exp(x) * sp.sin(x), x, 0, 8)\nprint(series)",
    "print(sum(primes[:100]), area, roots)",
]
"""The trajectory: each cell builds on the earlier ones' variables."""


def replay_program(turn: int) -> str:
    """Call `turn` of the replay mode: earlier cells with their output suppressed, then the new."""
    if turn == 0:
        return CELLS[0]
    history = "\n".join(CELLS[:turn])
    return (
        "import contextlib as _c, io as _io\n"
        f"with _c.redirect_stdout(_io.StringIO()):\n    exec({history!r}, globals())\n"
        + CELLS[turn]
    )


@dataclass
class Trajectory:
    """Latencies and server times of one trajectory's calls."""

    latencies_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    restored: int = 0


async def run_trajectory(client: httpx.AsyncClient, mode: str, expected: list[str]) -> Trajectory:
    """Run the ten turns in one mode; every turn's stdout must match `expected`."""
    out = Trajectory()
    session_id = f"bench-{uuid.uuid4().hex}"
    for turn in range(len(CELLS)):
        if mode == "session":
            body: dict[str, object] = {"code": CELLS[turn], "session_id": session_id}
        else:
            body = {"code": replay_program(turn)}
        body["timeout"] = 30
        started = time.perf_counter()
        response = await client.post("/execute", json=body)
        out.latencies_s.append(time.perf_counter() - started)
        result = response.json()
        if result.get("status") != "ok" or result["stdout"] != expected[turn]:
            raise RuntimeError(f"{mode} turn {turn}: {result}")
        out.wall_s.append(result["wall_time"])
        out.cpu_s.append(result["cpu_time"])
        out.restored += bool(result.get("restored"))
    if mode == "session":
        await client.delete(f"/sessions/{session_id}")
    return out


def summary(mode: str, scenario: str, runs: list[Trajectory]) -> dict[str, object]:
    """One table row: means over the trajectories, in milliseconds."""

    def mean_ms(values: list[float]) -> float:
        return round(statistics.mean(values) * 1000, 1)

    return {
        "mode": mode,
        "scenario": scenario,
        "trajectories": len(runs),
        "tool_time_ms": mean_ms([sum(t.latencies_s) for t in runs]),
        "turn1_ms": mean_ms([t.latencies_s[0] for t in runs]),
        "turns2_10_ms": mean_ms([sum(t.latencies_s[1:]) for t in runs]),
        "turn10_ms": mean_ms([t.latencies_s[-1] for t in runs]),
        "server_wall_ms": mean_ms([sum(t.wall_s) for t in runs]),
        "server_cpu_ms": mean_ms([sum(t.cpu_s) for t in runs]),
        "restored": sum(t.restored for t in runs),
    }


async def measure(url: str, trajectories: int, concurrent: int) -> list[dict[str, object]]:
    """Both modes, sequential then concurrent; the expected outputs come from a session run."""
    rows: list[dict[str, object]] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        expected = []
        warm_id = f"bench-warm-{uuid.uuid4().hex}"
        for code in CELLS:  # also warms the jails and fixes the expected output
            r = (await client.post("/execute", json={"code": code, "session_id": warm_id})).json()
            expected.append(r["stdout"])
        await client.delete(f"/sessions/{warm_id}")
        for mode in ("session", "replay"):
            runs = [await run_trajectory(client, mode, expected) for _ in range(trajectories)]
            rows.append(summary(mode, "one at a time", runs))
        for mode in ("session", "replay"):
            runs = list(
                await asyncio.gather(
                    *(run_trajectory(client, mode, expected) for _ in range(concurrent))
                )
            )
            rows.append(summary(mode, f"{concurrent} at once", runs))
    return rows


def start_service(workers: int, spares: int) -> PrivateService:
    """`rl-sandbox up` on a free port with session spares, once ready."""
    from sandbox_service.local.private import PrivateService

    settings = {
        "workers": str(workers),
        "queue_name": "bench-sessions",
        "cgroup_parent": "rl-sandbox-bench-sessions",
        "sandbox_uid_base": "66000",
        "log_level": "WARNING",
        "session_spares": str(spares),
    }
    return PrivateService(settings).start()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an already running service (default: start one)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--trajectories", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=8)
    parser.add_argument("--session-spares", type=int, default=1, help="per worker (started here)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    service = None
    url = args.url
    if url is None:
        service = start_service(args.workers, args.session_spares)
        url = service.url
    try:
        rows = asyncio.run(measure(url, args.trajectories, args.concurrent))
    finally:
        if service is not None:
            service.stop()
    header = list(rows[0])
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row[k]) for k in header))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"workers": args.workers, "session_spares": args.session_spares, "rows": rows},
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
