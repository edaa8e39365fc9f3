#!/usr/bin/env python3
"""How fast a cancelled group frees the workers: 512 sleeping calls of one group, cancelled.

Each round sends `--calls` programs that sleep 30 s, all in one group (one POST /execute/batch),
waits until the workers are running some of them and the rest wait in the queue, then cancels
the group (POST /groups/{group}/cancel). Reported per round:

- `cancel_s`: the cancel's own latency (send to answer);
- `answered_s`: from the cancel's answer until the batch's answer (every call `cancelled`);
- `free_s`: from the cancel's answer until one `print(1)` per worker, sent at once right after
  the answer, has come back: every worker took a new job, so none still runs a cancelled one.

Starts `rl-sandbox up` on a free loopback port (private Redis) unless --url is given:

    .venv/bin/python scripts/group_cancel.py [--url URL] [--workers 2] [--calls 512] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from sandbox_service.local.private import PrivateService

SLEEPER = "import time\ntime.sleep(30)"


async def one_round(http: httpx.AsyncClient, workers: int, calls: int) -> dict[str, Any]:
    """Send, cancel and time one group (see the module doc)."""
    group = f"bench/{uuid.uuid4().hex[:12]}"
    body = {"requests": [{"code": SLEEPER, "timeout": 60, "group": group}] * calls}
    batch = asyncio.ensure_future(http.post("/execute/batch", json=body, timeout=120))
    batch_answered = 0.0

    def note_answer(_: object) -> None:
        nonlocal batch_answered
        batch_answered = time.perf_counter()

    batch.add_done_callback(note_answer)
    await asyncio.sleep(3.0)  # the workers have started some, the rest wait
    if batch.done():
        raise RuntimeError(f"the batch was answered before the cancel: {batch.result().text}")
    sent = time.perf_counter()
    cancel = await http.post(f"/groups/{group}/cancel")
    answered = time.perf_counter()
    cancel.raise_for_status()
    probes = [http.post("/execute", json={"code": "print(1)"}) for _ in range(workers)]
    free = await asyncio.gather(*probes)
    freed = time.perf_counter()
    response = await batch
    response.raise_for_status()
    statuses = {r["status"] for r in response.json()["results"]}
    if statuses != {"cancelled"} or any(p.json()["status"] != "ok" for p in free):
        raise RuntimeError(f"unexpected statuses: {statuses}")
    return {
        "cancelled": cancel.json()["cancelled"],
        "cancel_s": round(answered - sent, 4),
        "answered_s": round(batch_answered - answered, 4),
        "free_s": round(freed - answered, 4),
    }


async def run(url: str, workers: int, calls: int, rounds: int) -> list[dict[str, Any]]:
    """`rounds` rounds against the service at `url`."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        await asyncio.gather(*(http.post("/execute", json={"code": "1"}) for _ in range(workers)))
        return [await one_round(http, workers, calls) for _ in range(rounds)]


def start_service(workers: int, calls: int) -> PrivateService:
    """`rl-sandbox up` on a free port, once ready."""
    from sandbox_service.local.private import PrivateService

    settings = {
        "workers": str(workers),
        "queue_name": "bench-group-cancel",
        "cgroup_parent": "rl-sandbox-bench-group-cancel",
        "sandbox_uid_base": "66200",
        "log_level": "WARNING",
        "max_batch": str(max(calls, 1024)),
    }
    return PrivateService(settings).start()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an already running service (default: start one)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--calls", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    service = None if args.url else start_service(args.workers, args.calls)
    url = args.url or (service.url if service else "")
    try:
        rounds = asyncio.run(run(url, args.workers, args.calls, args.rounds))
    finally:
        if service is not None:
            service.stop()
    report = {"workers": args.workers, "calls": args.calls, "rounds": rounds}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
