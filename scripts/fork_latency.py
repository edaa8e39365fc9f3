#!/usr/bin/env python3
"""Forking a prepared session into n rollouts, against making n sessions and replaying its cells.

A prepared notebook state (numpy and sympy imported, data made, a helper defined, a file written:
SETUP) is what an agentic rollout starts from; GRPO samples n rollouts from it. Two ways, for
n = 1, 8, 64 (each mode's sessions deleted before the next):

- `fork`: one session runs SETUP, then POST /sessions/{id}/fork with n; then every fork runs
  PROBE at once. Reported: the fork's answer, and the time until all n forks answered PROBE
  (fork included), and how many of those cells replayed (`restored`; 0 when the forks are live
  copies of the interpreter).
- `replay`: n new sessions each run SETUP then PROBE, all n at once (what a client does without
  forks, and what a fork costs when it is rebuilt from its records). Reported: the time until
  all n answered PROBE.

Every PROBE must print the same line (checked). Starts `rl-sandbox up` on a free loopback port
(private Redis) unless --url is given:

    .venv/bin/python scripts/fork_latency.py [--url URL] [--rounds 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from sandbox_service.local.private import PrivateService

SETUP = [
    "import numpy as np\nimport sympy as sp\nx = sp.symbols('x')",
    "data = np.random.default_rng(0).standard_normal(200_000)\nstats = (data.mean(), data.std())",
    "def helper(v):\n    return sp.factor(v**4 - 1)\nfactored = helper(x)",
    "open('notes.txt', 'w').write(f'{stats[1]:.4f}')\nNone",
]
"""The prepared state: each cell builds on the earlier ones."""
PROBE = "print(factored, round(float(stats[1]), 2), open('notes.txt').read())"
EXPECTED = "(x - 1)*(x + 1)*(x**2 + 1) 1.0 1.0012\n"


async def cell(client: httpx.AsyncClient, session: str, code: str) -> dict[str, Any]:
    response = await client.post("/execute", json={"code": code, "session_id": session})
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    if result["status"] != "ok":
        raise RuntimeError(f"cell failed: {result}")
    return result


async def prepared(client: httpx.AsyncClient, session: str) -> dict[str, Any]:
    for code in SETUP:
        await cell(client, session, code)
    return await cell(client, session, PROBE)


def new_id() -> str:
    return f"bench-{uuid.uuid4().hex}"


async def fork_round(client: httpx.AsyncClient, n: int) -> dict[str, float]:
    parent = new_id()
    await prepared(client, parent)
    started = time.perf_counter()
    response = await client.post(f"/sessions/{parent}/fork", json={"n": n})
    response.raise_for_status()
    answered = time.perf_counter() - started
    forks = response.json()["session_ids"]
    results = await asyncio.gather(*(cell(client, f, PROBE) for f in forks))
    total = time.perf_counter() - started
    if any(r["stdout"] != EXPECTED for r in results):
        raise RuntimeError(f"a fork printed something else: {results[0]['stdout']!r}")
    await asyncio.gather(*(client.delete(f"/sessions/{s}") for s in [parent, *forks]))
    restored = sum(bool(r["restored"]) for r in results)
    return {"fork_answer_s": answered, "all_probed_s": total, "restored": restored}


async def replay_round(client: httpx.AsyncClient, n: int) -> dict[str, float]:
    sessions = [new_id() for _ in range(n)]
    started = time.perf_counter()
    results = await asyncio.gather(*(prepared(client, s) for s in sessions))
    total = time.perf_counter() - started
    if any(r["stdout"] != EXPECTED for r in results):
        raise RuntimeError(f"a replay printed something else: {results[0]['stdout']!r}")
    await asyncio.gather(*(client.delete(f"/sessions/{s}") for s in sessions))
    return {"all_probed_s": total}


def median(rounds: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rounds)


async def measure(url: str, sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    rows = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await prepared(client, new_id())  # warm the workers' spare session jails
        for n in sizes:
            forks = [await fork_round(client, n) for _ in range(rounds)]
            replays = [await replay_round(client, n) for _ in range(rounds)]
            fork_total = median(forks, "all_probed_s")
            replay_total = median(replays, "all_probed_s")
            rows.append(
                {
                    "n": n,
                    "fork answer ms": round(median(forks, "fork_answer_s") * 1000, 1),
                    "fork + n probes ms": round(fork_total * 1000, 1),
                    "restored": int(max(r["restored"] for r in forks)),
                    "replay n sessions ms": round(replay_total * 1000, 1),
                    "replay / fork": round(replay_total / fork_total, 1),
                }
            )
            print(rows[-1], flush=True)
    return rows


def start_service(workers: int, max_sessions: int) -> PrivateService:
    """`rl-sandbox up` on a free port, room for a parent and 64 live forks per worker."""
    from sandbox_service.local.private import PrivateService

    settings = {
        "workers": str(workers),
        "queue_name": "bench-forks",
        "cgroup_parent": "rl-sandbox-bench-forks",
        "sandbox_uid_base": "67000",
        "log_level": "WARNING",
        "max_sessions_per_worker": str(max_sessions),
        # 64 sessions replaying at once on two workers wait minutes in the queue, not 60 s.
        "queue_deadline_s": "300",
        "client_response_margin_s": "600",
    }
    return PrivateService(settings).start()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an already running service (default: start one)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="1,8,64", help="comma-separated n")
    parser.add_argument("--max-sessions-per-worker", type=int, default=70)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    service = None
    url = args.url
    if url is None:
        service = start_service(args.workers, args.max_sessions_per_worker)
        url = service.url
    try:
        sizes = [int(n) for n in args.sizes.split(",")]
        rows = asyncio.run(measure(url, sizes, args.rounds))
    finally:
        if service is not None:
            service.stop()
    header = list(rows[0])
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row[k]) for k in header))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workers": args.workers, "rounds": args.rounds, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
