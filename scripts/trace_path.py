#!/usr/bin/env python3
"""Where the milliseconds of one call go: a timeline of `print(1)` at concurrency 1, by segment.

Means of consecutive segments add up to the end-to-end mean; medians need not.

Starts a private Redis, one worker and one API (each in its own process, as in production), with
timestamps (CLOCK_REALTIME, shared by all processes of the machine) taken at the boundaries of the
request path by wrapping a few functions; a client sends N calls one after the other, each with
its own X-Request-ID. Prints the median (and p90) of each segment and the end-to-end latency.
Diagnostic only: the wrapped names are internal and may move.

    .venv/bin/python scripts/trace_path.py [--calls 300] [--code 'print(1)'] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

STAMPS: list[tuple[str, str, int]] = []
"""(event, key, time_ns) recorded in this process."""


def stamp(event: str, key: str) -> None:
    STAMPS.append((event, key, time.time_ns()))


def dump(path: Path) -> None:
    path.write_text("\n".join(json.dumps(s) for s in STAMPS) + "\n")


def wrap(owner: Any, name: str, before: Any = None, after: Any = None) -> None:
    """Replace owner.name by a wrapper calling before(*args) and after(result, *args)."""
    original = getattr(owner, name)
    func = getattr(original, "__func__", original)
    is_class = isinstance(owner.__dict__.get(name), classmethod)
    if asyncio.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            if before:
                before(*args)
            result = await func(*args, **kwargs)
            if after:
                after(result, *args)
            return result

        replacement: Any = async_wrapper
    else:

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if before:
                before(*args)
            result = func(*args, **kwargs)
            if after:
                after(result, *args)
            return result

        replacement = wrapper
    setattr(owner, name, classmethod(replacement) if is_class else replacement)


def patch_api() -> None:
    from sandbox_service.api import awaiting, edge
    from sandbox_service.broker import jobqueue

    original_call = edge.Edge.__call__

    async def edge_call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        rid = dict(scope.get("headers", [])).get(b"x-request-id", b"").decode()
        if scope["type"] == "http" and rid:
            stamp("api_in", rid)

            async def traced_send(message: Any) -> None:
                if message["type"] == "http.response.start":
                    stamp("api_out", rid)
                await send(message)

            return await original_call(self, scope, receive, traced_send)
        return await original_call(self, scope, receive, send)

    edge.Edge.__call__ = edge_call  # type: ignore[method-assign]

    def admit_before(self: Any, groups: Any, *rest: Any) -> None:
        # JobQueue.admit (thread) or JobQueue.admission (script), whichever admits.
        for group in groups:
            for job in group:
                stamp("admit_start", job.execution_id)
                stamp(f"rid={job.payload.request_id}", job.execution_id)

    def admit_after(result: Any, self: Any, groups: Any, *rest: Any) -> None:
        for group in groups:
            for job in group:
                stamp("admit_end", job.execution_id)

    for name in ("admit", "admission"):
        if hasattr(jobqueue.JobQueue, name):
            wrap(jobqueue.JobQueue, name, admit_before, admit_after)

    def notices(self: Any, raws: Any) -> None:
        for raw in raws:
            stamp("notice", json.loads(raw)["id"])

    wrap(awaiting.Awaiter, "_on_notices", notices)


def patch_worker() -> None:
    from rq.queue import Queue

    from sandbox_service.broker import jobqueue
    from sandbox_service.jail import executor
    from sandbox_service.worker import main as worker

    def dequeued(result: Any, *args: Any) -> None:
        if result is not None:
            stamp("dequeued", result[0].id)

    wrap(Queue, "dequeue_any", after=dequeued)
    wrap(jobqueue.LeanWorker, "execute_job", lambda self, job, queue: stamp("execute", job.id))
    wrap(
        worker.JobRunner,
        "run",
        lambda self, execution_id, *_: stamp("run_start", execution_id),
        lambda result, self, execution_id, *_: stamp("run_end", execution_id),
    )
    wrap(
        executor.JailExecutor,
        "run",
        lambda self, spec, *_: stamp("jail_start", spec.execution_id),
        lambda result, self, spec, *_: stamp("jail_end", spec.execution_id),
    )
    wrap(
        jobqueue.LeanWorker,
        "_deliver",
        lambda self, job, *a: stamp("deliver_start", job.id),
        lambda result, self, job, *a: stamp("deliver_end", job.id),
    )


SEGMENTS = [
    ("client -> API (HTTP in)", "client_send", "api_in"),
    ("API: parse, validate, hand to the admission task", "api_in", "admit_start"),
    ("API: build the admission (RQ job, script arguments)", "admit_start", "admit_end"),
    (
        "admission built -> worker has the job (script, wake-up, BLPOP, HGETALL)",
        "admit_end",
        "dequeued",
    ),
    ("API in -> worker has the job (all of admission)", "api_in", "dequeued"),
    ("worker: prepare pipeline (job started by this worker)", "dequeued", "run_start"),
    ("worker: payload -> spec", "run_start", "jail_start"),
    ("jail: executor.run (fork, program, teardown, report)", "jail_start", "jail_end"),
    ("worker: result -> wire", "jail_end", "run_end"),
    (
        "worker: run returned -> deliver sent (death penalty off, result JSON)",
        "run_end",
        "deliver_start",
    ),
    ("worker: deliver sent -> API listener has the notice", "deliver_start", "notice"),
    ("API: resolve, respond", "notice", "api_out"),
    ("API -> client (HTTP out)", "api_out", "client_recv"),
    ("end to end", "client_send", "client_recv"),
]


async def client(port: int, calls: int, code: str) -> None:
    """Closed loop at concurrency 1 on one keep-alive connection; 20 untimed calls first."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"code": code}).encode()
    for i in range(calls + 20):
        rid = f"trace{i:06d}"
        head = (
            f"POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"X-Request-ID: {rid}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        if i >= 20:
            stamp("client_send", rid)
        writer.write(head + body)
        await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.partition(b":")
            if key.lower() == b"content-length":
                length = int(value)
        raw = await reader.readexactly(length)
        if i >= 20:
            stamp("client_recv", rid)
        assert json.loads(raw)["status"] == "ok", raw
    writer.close()


def analyse(files: list[Path]) -> dict[str, Any]:
    events: dict[str, dict[str, int]] = defaultdict(dict)
    rid_of: dict[str, str] = {}
    for path in files:
        for line in path.read_text().splitlines():
            event, key, t = json.loads(line)
            if event.startswith("rid="):
                rid_of[key] = event[4:]
            else:
                events[key][event] = t
    # Merge each job's events into its request's.
    for execution_id, rid in rid_of.items():
        events[rid].update(events.pop(execution_id, {}))
    rows = []
    for label, start, end in SEGMENTS:
        deltas = [(e[end] - e[start]) / 1e6 for e in events.values() if start in e and end in e]
        if deltas:
            deltas.sort()
            rows.append(
                {
                    "segment": label,
                    "n": len(deltas),
                    "p50_ms": round(statistics.median(deltas), 3),
                    "p90_ms": round(deltas[int(0.9 * len(deltas))], 3),
                    "mean_ms": round(statistics.fmean(deltas), 3),
                }
            )
    return {"rows": rows, "load_avg": [round(x, 2) for x in os.getloadavg()]}


def orchestrate(args: argparse.Namespace) -> int:
    from sandbox_service.local import procs
    from sandbox_service.local.procs import wait_ready
    from sandbox_service.local.redis_server import start_redis_server

    trace_dir = Path(tempfile.mkdtemp(prefix="rl-sandbox-trace-"))
    redis_server = start_redis_server(unix_socket=True)  # as `rl-sandbox up` does
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_SANDBOX_")}
    env.update(
        {
            "RL_SANDBOX_REDIS_URL": redis_server.url,
            "RL_SANDBOX_QUEUE_NAME": "rl-sandbox-trace",
            "RL_SANDBOX_CGROUP_PARENT": "rl-sandbox-trace",
            "RL_SANDBOX_SANDBOX_UID_BASE": "64500",
            "RL_SANDBOX_LOG_LEVEL": "WARNING",
            "TRACE_DIR": str(trace_dir),
        }
    )
    port = procs.free_port()
    me = [sys.executable, os.path.abspath(__file__)]
    worker = procs.spawn([*me, "--role", "worker"], env)
    api = procs.spawn([*me, "--role", "api", "--port", str(port)], env)
    load_before = os.getloadavg()
    try:
        wait_ready(f"http://127.0.0.1:{port}", 120, None)
        asyncio.run(client(port, args.calls, args.code))
        dump(trace_dir / "client.jsonl")
    finally:
        for proc in (api, worker):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        redis_server.stop()
    report = analyse(sorted(trace_dir.glob("*.jsonl")))
    report["load_avg_before"] = [round(x, 2) for x in load_before]
    report["code"] = args.code
    print(f"{args.calls} calls of {args.code!r} at concurrency 1; load average before "
          f"{report['load_avg_before']}, after {report['load_avg']}")  # fmt: skip
    print("| segment | p50 ms | p90 ms | mean ms |\n|---|---|---|---|")
    for row in report["rows"]:
        print(
            f"| {row['segment']} | {row['p50_ms']:.2f} | {row['p90_ms']:.2f} "
            f"| {row['mean_ms']:.2f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["api", "worker"], default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--code", default="print(1)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.role is None:
        return orchestrate(args)
    from sandbox_service.logs import configure_logging
    from sandbox_service.settings import Settings

    settings = Settings(workers=1)
    configure_logging(args.role, settings.log_level)
    out = Path(os.environ["TRACE_DIR"]) / f"{args.role}.jsonl"
    if args.role == "api":
        from sandbox_service.api.server import serve

        patch_api()
        code = serve(settings, "127.0.0.1", args.port)
    else:
        from sandbox_service.worker import main as worker

        patch_worker()
        code = worker.run(settings, 0)
    dump(out)
    return code


if __name__ == "__main__":
    sys.exit(main())
