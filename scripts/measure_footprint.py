#!/usr/bin/env python3
"""Memory footprint for sizing: Redis bytes per queued execution and per kept result, and the
memory of one worker slot at rest (worker process + its jails: nsjail, zygote, standby child;
the lean, the math and the data zygote apart).

Redis: a private redis-server; N `print(i)` jobs admitted through the API's own admission script,
then N results of `print(i)` stored as workers store them; INFO used_memory before and after.
Slots: a private `rl-sandbox up` (warm executors), idle for a few seconds; the PSS (proportional
set size: shared pages counted once across processes) of each worker's process tree, and its RSS.

    .venv/bin/python scripts/measure_footprint.py [--jobs 10000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from typing import Any

import psutil
import redis

from sandbox_service import keys
from sandbox_service.bench.command import private_stack
from sandbox_service.broker import jobqueue
from sandbox_service.execution import ExecutionResult, Status
from sandbox_service.jobs import JobPayload, encode_result, result_to_wire
from sandbox_service.local.redis_server import start_redis_server


def redis_footprint(jobs: int) -> dict[str, float]:
    server = start_redis_server()
    try:
        client = redis.Redis.from_url(server.url)
        queue = jobqueue.JobQueue(client, "footprint", result_ttl_s=300)
        script = client.register_script(jobqueue.ADMIT_SCRIPT)

        def used() -> int:
            return int(client.info("memory")["used_memory"])

        before = used()
        now = time.time()
        for start in range(0, jobs, 500):
            group = []
            for i in range(start, min(jobs, start + 500)):
                payload = JobPayload(code=f"print({i})", request_id=uuid.uuid4().hex,
                                     reply_to="footprint:reply:x", admitted_at=now,
                                     start_by=now + 60)  # fmt: skip
                group.append(jobqueue.NewJob(uuid.uuid4().hex, payload, 25.0))
            script_keys, argv = queue.admission([group], 10**9)
            script(keys=script_keys, args=argv)
        queued = used()
        for i in range(jobs):
            result = result_to_wire(ExecutionResult(status=Status.OK, stdout=f"{i}\n"), f"{i:032x}")
            client.set(keys.result("footprint", f"{i:032x}"), encode_result(result), ex=300)
        kept = used()
        return {
            "bytes_per_queued_execution": round((queued - before) / jobs),
            "bytes_per_kept_result_print": round((kept - queued) / jobs),
        }
    finally:
        server.stop()


def slot_footprint(workers: int) -> dict[str, Any]:
    stack = private_stack(workers).start(ready_timeout_s=180)
    try:
        time.sleep(5)
        slots = []
        api_rss = 0.0
        for proc in psutil.Process(stack.pid).children(recursive=True):
            cmdline = " ".join(proc.cmdline())
            if " api" in cmdline:
                api_rss = proc.memory_info().rss / 2**20
            if "sandbox_service.worker.main" not in cmdline:
                continue
            tree = [proc, *proc.children(recursive=True)]
            pss = sum(p.memory_full_info().pss for p in tree) / 2**20
            rss = sum(p.memory_info().rss for p in tree) / 2**20
            slots.append(
                {
                    "processes": len(tree),
                    "pss_mib": round(pss, 1),
                    "rss_mib": round(rss, 1),
                    "jails": [_jail_footprint(p) for p in tree if p.name() == "nsjail"],
                }
            )
        return {"slots": slots, "api_rss_mib_idle": round(api_rss, 1)}
    finally:
        stack.stop()


def _jail_footprint(nsjail: psutil.Process) -> dict[str, Any]:
    """One jail's processes (nsjail, its zygote, the standby) and which of the slot's zygotes
    it is (jail/zygotes.py)."""
    tree = [nsjail, *nsjail.children(recursive=True)]
    return {
        "zygote": _zygote_of(tree),
        "pss_mib": round(sum(p.memory_full_info().pss for p in tree) / 2**20, 1),
        "rss_mib": round(sum(p.memory_info().rss for p in tree) / 2**20, 1),
    }


def _zygote_of(tree: list[psutil.Process]) -> str:
    for process in tree:
        argv: list[str] = process.cmdline()
        if "--preload-zygote" in argv[:-1]:
            return argv[argv.index("--preload-zygote") + 1]
    return "data"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    report = {
        "redis": redis_footprint(args.jobs),
        "workers": slot_footprint(args.workers),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
