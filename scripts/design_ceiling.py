"""The ceiling of this design: the service's path with no program at all, and with a fork only.

Three stacks side by side, each the real API and its own Redis with two workers on the real
LeanWorker loop, differing only in what a worker does with a job:

    answer   answers at once: the API, RQ's loop and Redis, no program and no fork
    fork-bare  the same with the zygote's heap as it is without --preload (its own modules,
             frozen, the interpreter's code on huge pages): a lean zygote's floor
    fork     asks a process that holds the zygote's preloaded heap (zygote.prepare_heap, as in
             the jail: huge pages, immortal objects, the interpreter's code on huge pages) to
             fork a child (fork_lean, as the standbys are) that _exits at once, and answers
             once it is reaped: the floor of a fork of that heap per call
    service  the product, a private `rl-sandbox up` (jails, zygotes, programs)

Then `print(i)` calls through each in turn (closed loop, --concurrency callers), alternating
with fresh interpreters of the plain venv (the bench's fair baseline) at the core count, for
--rounds rounds; every answer is checked. Prints, per round and as medians: calls/s, CPU ms per
call by component (as `rl-sandbox bench` counts it) and the throughput ratio against the
baseline of the same round. If even `fork` stays under 3x the baseline, no fork-per-call jail
behind this API and queue reaches 3x on this machine at this hour. With --batch N the calls
travel N to a request (/execute/batch, chunked to the workers as the product chunks them): the
ceiling of batched calls, whose CPU per call `fork-bare` bounds from below for any jail that
forks once per call.

    .venv/bin/python scripts/design_ceiling.py [--rounds 3] [--round-s 5] [--concurrency 4]
        [--batch 1]

Diagnostic only; run it on a quiet machine (it measures).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
MODES = ("answer", "fork-bare", "fork", "service")
QUEUE = "design-ceiling"


def worker(url: str, queue: str, name: str, mode: str) -> None:
    """A LeanWorker on `queue` whose handler answers `print(i)` with `i` (mode `answer`; also
    scripts/profile_api.py's stub workers), in the fork modes once the forker (its child,
    `zygote-floor` in its command line: the bench counts it as the jail) has forked."""
    from sandbox_service.broker.jobqueue import LeanWorker, connect_worker
    from sandbox_service.execution import Status
    from sandbox_service.jobs import failure_result

    floor: subprocess.Popen[bytes] | None = None
    if mode.startswith("fork"):
        floor = subprocess.Popen(
            [sys.executable, __file__, "zygote-floor", mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert floor.stdout is not None and floor.stdout.read(1) == b"r"

    class Handler:
        def run(self, execution_id: str, payload: object) -> dict[str, object]:
            if floor is not None:
                assert floor.stdin is not None and floor.stdout is not None
                floor.stdin.write(b"f")
                floor.stdin.flush()
                if floor.stdout.read(1) != b"1":
                    raise RuntimeError("the forker failed")
            result = failure_result(Status.OK, "", execution_id)
            code: str = payload.code  # type: ignore[attr-defined]
            result.update(stdout=code[6:-1] + "\n", stderr="", exit_code=0)
            return result

        def abandon(self, execution_id: str, payload: object, reason: str) -> dict[str, object]:
            return failure_result(Status.SANDBOX_ERROR, reason, execution_id)

    LeanWorker(Handler(), queue, 60, connection=connect_worker(url), name=name).work(
        logging_level="WARNING", with_scheduler=False
    )


def zygote_floor(mode: str) -> None:
    """The zygote's heap (preloaded unless fork-bare), then one fork per byte on stdin; a byte
    back when the child is reaped."""
    import gc

    from sandbox_service.jail.inside import heap, libc

    if mode == "fork":
        heap.prepare_heap(huge_code=True)
    else:  # as the zygote's main (inside/pid1.py) without --preload
        gc.collect()
        gc.freeze()
        heap.interpreter_code_on_huge_pages()
    os.write(1, b"r")
    while os.read(0, 1):
        pid = libc.fork_lean()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        os.write(1, b"1")


def stack(mode: str, port: int) -> None:
    """Redis, the API and two workers of `mode` as this process's children, until SIGTERM."""
    from sandbox_service.local.redis_server import start_redis_server

    server = start_redis_server(unix_socket=True)
    env = {
        **os.environ,
        "RL_SANDBOX_REDIS_URL": server.url,
        "RL_SANDBOX_QUEUE_NAME": QUEUE,
        "RL_SANDBOX_LOG_LEVEL": "WARNING",
        "RL_SANDBOX_MAX_QUEUE_DEPTH": "100000",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "worker", server.url, QUEUE, f"w{n}", mode], env=env
        )
        for n in range(2)
    ]
    api = [sys.executable, "-m", "sandbox_service.cli", "api", "--host", "127.0.0.1"]
    procs.append(subprocess.Popen([*api, "--port", str(port)], env=env))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)
    server.stop()


COMPONENTS = ("api", "workers", "jail", "redis")


def _parts(cpus: list[dict[str, float]]) -> str:
    """The median CPU ms per call of each component, api/workers/jail/redis."""
    return "/".join(f"{statistics.median(c.get(k, 0.0) for c in cpus):.2f}" for k in COMPONENTS)


async def rounds(args: argparse.Namespace, ports: dict[str, int], roots: dict[str, int]) -> None:
    """Warm each stack up, then the alternating rounds; print each round and the medians."""
    from sandbox_service.bench.baseline import baselines
    from sandbox_service.bench.points import Point, baseline_point, service_point
    from sandbox_service.bench.procs import StackSampler
    from sandbox_service.bench.workloads import WORKLOADS

    workload = WORKLOADS["print"]
    fair = baselines()[0]
    cores = os.cpu_count() or 1
    for mode in MODES:
        warm = Point("service", "print", args.concurrency, args.batch)
        await service_point(warm, "127.0.0.1", ports[mode], workload, 2.0, 10**6, 10.0)
        if warm.failed:
            raise SystemExit(f"{mode}: the warm-up failed: {warm.first_failure}")
    # Per mode (and "base"): each round's point row and CPU ms per call by component.
    results: dict[str, list[tuple[dict[str, Any], dict[str, float]]]] = {
        m: [] for m in (*MODES, "base")
    }
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
            sampler = StackSampler.of_stack(roots[mode])
            sampler.refresh()
            point = Point("service", "print", args.concurrency, args.batch)
            sampler.start()
            await service_point(
                point, "127.0.0.1", ports[mode], workload, args.round_s, 10**6, 10.0
            )
            cpu, _ = await sampler.stop(len(point.latencies_s) * args.batch)
            row = point.row()
            if row["failed"]:
                raise SystemExit(f"{mode}: {row['failed']} failed: {row['first_failure']}")
            results[mode].append((row, cpu))
        base = Point("baseline", "print", cores, baseline=fair.name)
        await baseline_point(base, fair, workload, args.round_s)
        results["base"].append((base.row(), base.cpu_ms_per_call))
        base_row, base_cpu = results["base"][-1]
        line = [f"round {r + 1}, load {os.getloadavg()[0]:.2f}:"]
        line.append(f"plain venv {base_row['calls_per_s']:.1f}/s ({base_cpu['total']:.2f} ms)")
        for mode in MODES:
            row, cpu = results[mode][-1]
            rate = row["calls_per_s"]
            line.append(
                f"{mode} {rate:.1f}/s {rate / base_row['calls_per_s']:.2f}x ({cpu['total']:.2f} "
                f"ms: {_parts([cpu])}; p50 {row['p50_ms']:.2f} ms)"
            )
        print("; ".join(line), flush=True)
    print("\nmedians over the rounds (CPU ms per call: api/workers/jail/redis, without the bench):")
    base_total = statistics.median(cpu["total"] for _, cpu in results["base"])
    for mode in MODES:
        ratios = [
            row["calls_per_s"] / base["calls_per_s"]
            for (row, _), (base, _) in zip(results[mode], results["base"], strict=True)
        ]
        cpus = [cpu for _, cpu in results[mode]]
        total = statistics.median(cpu["total"] for cpu in cpus)
        print(
            f"  {mode:9s} throughput {statistics.median(ratios):.2f}x the plain venv "
            f"(rounds {', '.join(f'{x:.2f}' for x in ratios)}), CPU {total:.2f} ms per call "
            f"({_parts(cpus)}), {base_total / total:.2f}x less than the plain venv's "
            f"{base_total:.2f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--round-s", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1, help="calls per request")
    args = parser.parse_args()
    from sandbox_service.bench.command import private_stack
    from sandbox_service.local.procs import free_port, wait_ready

    service = private_stack(None)
    service.start()
    launched: list[subprocess.Popen[bytes]] = []
    try:
        ports = {"service": int(service.url.rsplit(":", 1)[1])}
        roots = {"service": service.pid}
        for mode in MODES[:-1]:
            ports[mode] = free_port()
            launched.append(
                subprocess.Popen([sys.executable, __file__, "stack", mode, str(ports[mode])])
            )
            roots[mode] = launched[-1].pid
        for mode, proc in zip(MODES[:-1], launched, strict=True):
            # /healthz: these workers do not heartbeat as the product's do (/readyz waits for
            # that); the warm-up's checked calls show that they answer.
            wait_ready(f"http://127.0.0.1:{ports[mode]}", 120, proc, path="/healthz")
        asyncio.run(rounds(args, ports, roots))
    finally:
        for proc in launched:
            proc.terminate()
        for proc in launched:
            proc.wait(timeout=60)
        service.stop()


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(*sys.argv[2:6])
    elif len(sys.argv) > 1 and sys.argv[1] == "zygote-floor":
        zygote_floor(sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "stack":
        stack(sys.argv[2], int(sys.argv[3]))
    else:
        main()
