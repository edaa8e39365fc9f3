"""`make loadtest`: Locust headless, for a bounded time, against a private service on loopback.

Starts `rl-sandbox up` on a free 127.0.0.1 port (its own Redis, queue, cgroups and jail uids),
waits until it is ready, runs loadtests/locustfile.py headless and writes Locust's CSV and HTML
reports under --out, with the load average before and after in run.json; then stops the service.
Exit status: Locust's (non-zero when any call failed its check).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import sys
import time
from pathlib import Path

from sandbox_service.bench.command import private_stack
from sandbox_service.bench.http import loopback_target
from sandbox_service.bench.procs import StackSampler
from sandbox_service.local.private import PrivateService

HERE = Path(__file__).resolve().parent
BATCH_SIZE = 8
"""Items per batch request in locustfile.py."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--spawn-rate", type=float, default=10.0)
    parser.add_argument("--run-time", default="60s", help="Locust's --run-time (bounded)")
    parser.add_argument("--no-sessions", action="store_true", help="leave SessionUser out")
    parser.add_argument("--url", default=None, help="a running service on loopback instead")
    parser.add_argument("--workers", type=int, default=None, help="workers of the private stack")
    parser.add_argument("--out", default="reports/loadtest")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stack: PrivateService | None = None
    if args.url:
        url = args.url.rstrip("/")
        loopback_target(url)
    else:
        stack = private_stack(args.workers).start()
        url = stack.url
    users = ["ToolCallUser"] + ([] if args.no_sessions else ["SessionUser"])
    argv = [
        sys.executable, "-m", "locust", "-f", str(HERE / "locustfile.py"), *users,
        "--headless", "--host", url, "--users", str(args.users),
        "--spawn-rate", str(args.spawn_rate), "--run-time", args.run_time,
        "--stop-timeout", "30", "--csv", str(out / "locust"), "--csv-full-history",
        "--html", str(out / "locust.html"), "--only-summary", "--loglevel", "WARNING",
    ]  # fmt: skip
    load_before = os.getloadavg()
    started = time.time()
    cpu: dict[str, float] = {}
    rss: dict[str, dict[str, float]] = {}
    try:
        sampler = StackSampler.of_stack(stack.pid) if stack is not None else None
        if sampler is not None:
            sampler.refresh()
        code, cpu, rss = asyncio.run(_locust(argv, sampler, out))
    finally:
        if stack is not None:
            stack.stop()
    summary = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "cores": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "users": users,
        "locust_argv": argv[3:],
        "exit_code": code,
        "executions": _executions(out),
        "cpu_ms_per_execution": cpu,
        "api_rss_mb": rss.get("api"),
    }
    (out / "run.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"load average before {summary['load_avg_before']}, after {summary['load_avg_after']}")
    if cpu:
        print(f"CPU ms per execution of the mix (private stack): {cpu}")
    print(f"reports: {out}/locust_stats.csv, {out}/locust.html")
    return code


async def _locust(
    argv: list[str], sampler: StackSampler | None, out: Path
) -> tuple[int, dict[str, float], dict[str, dict[str, float]]]:
    """Run Locust; with a private stack, its CPU per execution and the API's RSS meanwhile."""
    if sampler is not None:
        sampler.start()
    proc = await asyncio.create_subprocess_exec(*argv)
    code = await proc.wait()
    if sampler is None:
        return code, {}, {}
    cpu, rss = await sampler.stop(_executions(out))
    cpu.pop("bench", None)  # the orchestrating process, not Locust
    return code, cpu, rss


def _executions(out: Path) -> int:
    """Programs run: single requests plus every item of the batches (from Locust's CSV)."""
    path = out / "locust_stats.csv"
    if not path.exists():
        return 0
    total = 0
    for row in csv.DictReader(path.open()):
        name, count = row["Name"], int(row["Request Count"])
        if name == "Aggregated" or name.startswith("/sessions"):
            continue
        total += count * (BATCH_SIZE if name.startswith("/execute/batch") else 1)
    return total


if __name__ == "__main__":
    sys.exit(main())
