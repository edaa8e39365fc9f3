"""Fair share between tenants, measured on a private service (`rl-sandbox up`, two tenants).

A light tenant runs a closed loop of `--light` concurrent calls; a heavy one floods with
`--ratio` times as many. The light tenant's latency (p50, p90) is measured alone, then under the
flood with the two keys (one queue per tenant, weighted dequeue), then under the same flood sent
with the light tenant's own key (one queue: what a single-key deployment does). Each call is
`time.sleep(--sleep-s)`, so that the workers, not this machine's CPUs, are the saturated resource.

    .venv/bin/python scripts/bench_tenants.py --workers 4 --light 2 --ratio 10 --calls 200

With `--flood-batch N` the heavy tenant floods with batches of N calls of
`time.sleep(--flood-sleep-s)` instead (a worker runs a batch's calls in chunks), and
`--light-code` sets the light tenant's program, e.g. a single `print(1)`:

    .venv/bin/python scripts/bench_tenants.py --workers 2 --light 1 --ratio 2 --calls 40 \
        --flood-batch 16 --flood-sleep-s 0.3 --light-code 'print(1)' --no-one-key

The light tenant alone keeps half the workers busy: its fair share of two equal weights, so
under the flood it should keep its latency (a tenant asking for more than its share is held
to it and waits, by design).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from sandbox_service.local.private import PrivateService

TENANTS = """
[[tenant]]
name = "light"
key = "key-light"

[[tenant]]
name = "heavy"
key = "key-heavy"
"""


async def closed_loop(
    http: httpx.AsyncClient,
    key: str,
    concurrency: int,
    code: str,
    stop: asyncio.Event,
    latencies: list[tuple[float, float]],
    wanted: int | None = None,
    batch: int = 0,
) -> None:
    """Send calls (`batch` > 0: batches of that many) from `concurrency` loops until `stop` is
    set (or `wanted` calls are done); append their (latency, queue time)."""
    headers = {"Authorization": f"Bearer {key}"}

    async def loop() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            if batch:
                body = {"requests": [{"code": code} for _ in range(batch)]}
                response = await http.post("/execute/batch", json=body, headers=headers)
                results = response.json()["results"] if response.status_code == 200 else []
            else:
                response = await http.post("/execute", json={"code": code}, headers=headers)
                results = [response.json()] if response.status_code == 200 else []
            if not results or any(result["status"] != "ok" for result in results):
                raise RuntimeError(f"call failed: {response.status_code} {response.text[:200]}")
            latency = time.perf_counter() - started
            latencies.extend((latency, result["queue_time"]) for result in results)
            if wanted is not None and len(latencies) >= wanted:
                stop.set()

    await asyncio.gather(*(loop() for _ in range(concurrency)))


async def phase(
    http: httpx.AsyncClient, args: argparse.Namespace, flood_key: str | None
) -> dict[str, float]:
    """The light tenant's latencies over `args.calls` calls, with a flood under `flood_key`."""
    code = args.light_code or f"import time; time.sleep({args.sleep_s})"
    flood_code = f"import time; time.sleep({args.flood_sleep_s or args.sleep_s})"
    stop_light, stop_flood = asyncio.Event(), asyncio.Event()
    light_latencies: list[tuple[float, float]] = []
    flood_latencies: list[tuple[float, float]] = []
    flood = None
    if flood_key:
        concurrency = args.light * args.ratio
        flood = asyncio.create_task(
            closed_loop(
                http,
                flood_key,
                concurrency,
                flood_code,
                stop_flood,
                flood_latencies,
                batch=args.flood_batch,
            )
        )
        await asyncio.sleep(2.0)  # the flood's backlog is built before the light calls start
    started = time.perf_counter()
    await closed_loop(http, "key-light", args.light, code, stop_light, light_latencies, args.calls)
    latencies = sorted(latency for latency, _ in light_latencies)
    queue_times = sorted(queue_time for _, queue_time in light_latencies)
    elapsed = time.perf_counter() - started
    flood_calls = len(flood_latencies)
    if flood is not None:
        stop_flood.set()
        await flood
    return {
        "light_calls": len(latencies),
        "light_p50_s": round(statistics.median(latencies), 4),
        "light_p90_s": round(latencies[int(0.9 * (len(latencies) - 1))], 4),
        "light_queue_p50_s": round(statistics.median(queue_times), 4),
        "light_calls_per_s": round(len(latencies) / elapsed, 1),
        "flood_calls": flood_calls,
    }


async def measure(url: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        await phase(http, argparse.Namespace(**{**vars(args), "calls": 20}), None)  # warm-up
        rows = {
            "alone": await phase(http, args, None),
            "flood, two keys (fair share)": await phase(http, args, "key-heavy"),
        }
        if not args.no_one_key:
            rows["flood, one key (one queue)"] = await phase(http, args, "key-light")
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--light", type=int, default=2, help="the light tenant's concurrency")
    parser.add_argument("--ratio", type=int, default=10, help="the flood's concurrency / light's")
    parser.add_argument("--calls", type=int, default=200, help="light calls measured per phase")
    parser.add_argument("--sleep-s", type=float, default=0.05, help="each call's program time")
    parser.add_argument("--light-code", default="", help="the light tenant's program")
    parser.add_argument("--flood-batch", type=int, default=0, help="flood with batches of N")
    parser.add_argument("--flood-sleep-s", type=float, default=0.0, help="the flood's calls")
    parser.add_argument("--no-one-key", action="store_true", help="skip the one-key phase")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tenants.toml"
        path.write_text(TENANTS)
        settings = {"tenants_file": str(path), "log_level": "WARNING"}
        with PrivateService(settings, workers=args.workers) as service:
            rows = asyncio.run(measure(service.url, args))
    alone = rows["alone"]["light_p50_s"]
    print(f"workers={args.workers} light={args.light} flood={args.light * args.ratio} "
          f"program=sleep({args.sleep_s}) light_code={args.light_code!r} "
          f"flood_batch={args.flood_batch} flood_sleep={args.flood_sleep_s}")  # fmt: skip
    for name, row in rows.items():
        ratio = row["light_p50_s"] / alone
        p50, p90 = row["light_p50_s"] * 1000, row["light_p90_s"] * 1000
        queue = row["light_queue_p50_s"] * 1000
        print(f"{name:30} p50 {p50:6.1f} ms ({ratio:4.2f}x alone)  p90 {p90:6.1f} ms  "
              f"queue p50 {queue:6.1f} ms  flood calls {row['flood_calls']}")  # fmt: skip
    print(json.dumps({"args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
