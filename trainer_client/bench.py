"""Measure micro-batching: N calls through the batching client vs one HTTP request per call.

    python -m trainer_client.bench http://127.0.0.1:8000 --calls 10000 --concurrency 256

Both arms run in the same process against the same service, with the same number of calls in
flight (`--concurrency` callers). They alternate in rounds (A B A B ...) so that a noisy machine
hurts both alike. The per-call arm is the same client with `max_batch_size=1`: exactly one HTTP
request per call, a connection per caller, same retries. Only the batching differs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from trainer_client.client import SandboxClient
from trainer_client.errors import SandboxClientError
from trainer_client.stats import percentile
from trainer_client.wire import Status


@dataclass(frozen=True)
class ArmResult:
    """One arm of one round."""

    arm: str
    calls: int
    wall_s: float
    calls_per_s: float
    p50_ms: float
    p99_ms: float
    ok: int
    wrong_output: int
    statuses: dict[str, int]
    exceptions: dict[str, int]
    http_requests: int
    mean_batch_size: float
    retries: int


async def run_arm(
    url: str, arm: str, calls: int, concurrency: int, api_key: str | None, batch_size: int
) -> ArmResult:
    """Run `calls` distinct `print(i)` programs with `concurrency` callers."""
    per_call = arm == "per-call"
    client = SandboxClient(
        url,
        api_key=api_key,
        max_batch_size=1 if per_call else batch_size,
        max_wait_s=0.0 if per_call else 0.005,
        max_concurrency=concurrency if per_call else max(1, min(16, concurrency)),
    )
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    exceptions: Counter[str] = Counter()
    wrong = 0

    async def one(i: int) -> None:
        nonlocal wrong
        async with gate:
            started = time.perf_counter()
            try:
                result = await client.execute(f"print({i})", timeout=10)
            except SandboxClientError as exc:
                exceptions[type(exc).__name__] += 1
                return
            latencies.append(time.perf_counter() - started)
            statuses[result.status] += 1
            if result.status == Status.OK and result.stdout.strip() != str(i):
                wrong += 1

    async with client:
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(calls)))
        wall_s = time.perf_counter() - started
        stats = client.stats()
    ordered = sorted(latencies)
    return ArmResult(
        arm=arm,
        calls=calls,
        wall_s=round(wall_s, 3),
        calls_per_s=round(calls / wall_s, 1),
        p50_ms=round(percentile(ordered, 50) * 1000, 1),
        p99_ms=round(percentile(ordered, 99) * 1000, 1),
        ok=statuses[Status.OK] - wrong,
        wrong_output=wrong,
        statuses=dict(statuses),
        exceptions=dict(exceptions),
        http_requests=stats.http_requests,
        mean_batch_size=round(stats.mean_batch_size, 2),
        retries=stats.retries,
    )


def render(results: Sequence[ArmResult]) -> str:
    """A markdown table of every arm of every round."""
    rows = [
        "| arm | calls | wall s | calls/s | p50 ms | p99 ms | ok | wrong | exceptions "
        "| HTTP requests | mean batch | retries |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.arm} | {r.calls} | {r.wall_s} | {r.calls_per_s} | {r.p50_ms} | {r.p99_ms} "
            f"| {r.ok} | {r.wrong_output} | {sum(r.exceptions.values())} | {r.http_requests} "
            f"| {r.mean_batch_size} | {r.retries} |"
        )
    return "\n".join(rows)


async def bench(args: argparse.Namespace) -> list[ArmResult]:
    """Alternate the two arms for `rounds` rounds; each round runs calls/rounds per arm."""
    per_round = max(1, args.calls // args.rounds)
    results = []
    for _ in range(args.rounds):
        for arm in ("batched", "per-call"):
            result = await run_arm(
                args.url, arm, per_round, args.concurrency, args.api_key, args.batch_size
            )
            print(render([result]).splitlines()[-1], file=sys.stderr, flush=True)
            results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: print a markdown table (and write JSON with --json)."""
    parser = argparse.ArgumentParser(prog="python -m trainer_client.bench", description=__doc__)
    parser.add_argument("url", help="base URL of the service")
    parser.add_argument("--calls", type=int, default=10_000, help="calls per arm, all rounds")
    parser.add_argument("--concurrency", type=int, default=256, help="callers in flight")
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two arms")
    parser.add_argument("--batch-size", type=int, default=64, help="max_batch_size, batched arm")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--json", default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    results = asyncio.run(bench(args))
    print(render(results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump([asdict(r) for r in results], out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
