"""What the API process costs per call without a jail: CPU per request, A/B across source trees.

Starts a private redis-server on a unix socket, stub workers (LeanWorkers whose handler answers
at once: no program runs) and one API process per source tree given (each `rl-sandbox api` with
PYTHONPATH at that tree), then drives each API in turn with a closed loop of keep-alive callers,
alternating rounds, and prints the API's CPU per call (its CPU clock, as `rl-sandbox bench`
reads it) for every round and the median per tree. Every answer is checked (status, and each
call's own stdout through the stub).

    .venv/bin/python scripts/profile_api.py [--tree DIR ...] [--route /execute|/run]
        [--mode full|answer|bare] [--calls 3000] [--concurrency 4] [--rounds 5]
        [--batch N] [--py-spy OUT.txt]

--mode answer replaces the dispatcher's submit with an immediate result (our route without the
job path); --mode bare serves a FastAPI route that returns a constant under the same uvicorn
settings (the floor of any FastAPI route here). --py-spy records the first tree's API under load
(one extra round, not counted) and writes py-spy's collapsed stacks. Run it under
`flock /tmp/rlsb-test.lock`: it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox_service.bench.http import Connection
from sandbox_service.local.procs import free_port
from sandbox_service.local.redis_server import start_redis_server

QUEUE = "profile-api"
HERE = Path(__file__).resolve().parent.parent

STUB_WORKER = (sys.executable, str(Path(__file__).resolve().parent / "design_ceiling.py"), "worker")
"""A LeanWorker whose handler answers at once (design_ceiling.py's `answer` mode), from this
checkout whatever --tree says: the trees compared are the APIs'."""

API = """
import sys
import sandbox_service
from sandbox_service.api.server import serve
print("serving", sandbox_service.__file__, flush=True)
from sandbox_service.settings import Settings

mode, port = sys.argv[1], int(sys.argv[2])
settings = Settings()
if mode == "answer":
    from sandbox_service.api.dispatch import Dispatcher
    from sandbox_service.execution import Status
    from sandbox_service.jobs import failure_result

    async def submit(self, payloads):
        results = []
        for payload in payloads:
            result = failure_result(Status.OK, "", "x")
            result.update(stdout=payload.code[6:-1] + "\\n", stderr="", exit_code=0)
            results.append(result)
        return results

    Dispatcher.submit = submit
if mode == "bare":
    import uvicorn
    from fastapi import FastAPI
    from fastapi.responses import Response

    app = FastAPI()
    BODY = b'{"status":"ok"}'

    @app.post("/execute")
    @app.post("/run")
    async def execute() -> Response:
        return Response(BODY, media_type="application/json")

    uvicorn.run(app, host="127.0.0.1", port=port, log_config=None, access_log=False,
                backlog=4096, timeout_keep_alive=30)
else:
    sys.exit(serve(settings, "127.0.0.1", port))
"""


def cpu_s(pid: int) -> float:
    """CPU seconds of a process, all threads (its scheduler clock, nanosecond resolution)."""
    return time.clock_gettime(((~pid) << 3) | 2)


def wait_ready(port: int, route: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            status, _ = asyncio.run(one_call(port, route, 0))
            if status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"API on port {port} did not answer")


def body(route: str, i: int, batch: int = 1) -> bytes:
    if batch > 1:
        requests = [{"code": f"print({i * batch + k})", "timeout": 10.0} for k in range(batch)]
        return json.dumps({"requests": requests}).encode()
    code = f"print({i})"
    if route == "/run":
        return json.dumps({"type": "python", "solution": code}).encode()
    return json.dumps({"code": code, "timeout": 10.0}).encode()


def check(route: str, i: int, status: int, raw: bytes, batch: int = 1) -> None:
    if status != 200:
        raise SystemExit(f"HTTP {status}: {raw[:300]!r}")
    if batch > 1:
        results = json.loads(raw)["results"]
        if len(results) != batch:
            raise SystemExit(f"{len(results)} results for {batch} calls")
        for k, result in enumerate(results):
            check_answer(i * batch + k, result, raw)
        return
    check_answer(i, json.loads(raw), raw)


def check_answer(i: int, answer: dict[str, object], raw: bytes) -> None:
    if "status" in answer and answer["status"] != "ok":
        raise SystemExit(f"not ok: {raw[:300]!r}")
    stdout = answer.get("stdout")
    if stdout is not None and stdout != f"{i}\n":
        raise SystemExit(f"wrong stdout: {raw[:300]!r}")


async def one_call(port: int, route: str, i: int) -> tuple[int, bytes]:
    conn = Connection("127.0.0.1", port)
    try:
        return await conn.request("POST", route, body(route, i))
    finally:
        conn.close()


async def load(port: int, route: str, calls: int, concurrency: int, batch: int = 1) -> float:
    """Run `calls` calls with `concurrency` callers (`batch` calls per request); the wall
    seconds it took."""
    remaining = iter(range(max(1, calls // batch)))
    path = "/execute/batch" if batch > 1 else route

    async def caller() -> None:
        conn = Connection("127.0.0.1", port)
        try:
            for i in remaining:
                status, raw = await conn.request("POST", path, body(route, i, batch))
                check(route, i, status, raw, batch)
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", default=[], help="source tree (repeatable)")
    parser.add_argument("--route", default="/execute", choices=["/execute", "/run"])
    parser.add_argument("--mode", default="full", choices=["full", "answer", "bare"])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--batch", type=int, default=1, help="calls per request (more: POST /execute/batch)"
    )
    parser.add_argument("--py-spy", default=None, help="collapsed stacks of the first tree's API")
    args = parser.parse_args()
    trees = [str(Path(t).resolve()) for t in args.tree] or [str(HERE)]
    server = start_redis_server(unix_socket=True)
    procs: list[subprocess.Popen[bytes]] = []
    logdir = Path(tempfile.mkdtemp(prefix="rl-sandbox-profile-api-"))
    try:
        env = {**os.environ, "PYTHONPATH": trees[0], "RL_SANDBOX_REDIS_URL": server.url}
        for n in range(args.workers if args.mode == "full" else 0):
            procs.append(
                subprocess.Popen(
                    [*STUB_WORKER, server.url, QUEUE, f"stub-{n}", "answer"],
                    env=env,
                    cwd=logdir,  # not this checkout: `-c` puts the working directory first
                )
            )
        ports = []
        for n, tree in enumerate(trees):
            port = free_port()
            api_env = {
                **os.environ,
                "PYTHONPATH": tree,
                "RL_SANDBOX_REDIS_URL": server.url,
                "RL_SANDBOX_QUEUE_NAME": QUEUE,
                "RL_SANDBOX_LOG_LEVEL": "WARNING",
                "RL_SANDBOX_MAX_QUEUE_DEPTH": "100000",
            }
            log = open(logdir / f"api-{n}.log", "wb")  # noqa: SIM115
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", API, args.mode, str(port)],
                    env=api_env,
                    cwd=logdir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            ports.append((port, procs[-1].pid))
        time.sleep(1.0)
        for n, (port, _) in enumerate(ports):
            wait_ready(port, args.route)
            print((logdir / f"api-{n}.log").read_text().splitlines()[0], flush=True)
        for port, _ in ports:  # warm-up
            asyncio.run(load(port, args.route, 300, args.concurrency, args.batch))
        if args.py_spy:
            port, pid = ports[0]
            spy = subprocess.Popen(
                ["py-spy", "record", "-r", "250", "-f", "raw", "-o", args.py_spy,
                 "-p", str(pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)
            asyncio.run(load(port, args.route, args.calls, args.concurrency, args.batch))
            spy.send_signal(2)
            spy.wait()
        per_call: dict[int, list[float]] = {n: [] for n in range(len(trees))}
        for r in range(args.rounds):
            order = range(len(trees)) if r % 2 == 0 else reversed(range(len(trees)))
            for n in order:
                port, pid = ports[n]
                cpu0 = cpu_s(pid)
                wall = asyncio.run(load(port, args.route, args.calls, args.concurrency, args.batch))
                ms = 1000 * (cpu_s(pid) - cpu0) / args.calls
                per_call[n].append(ms)
                print(
                    f"round {r} tree {n}: API CPU {ms:.3f} ms/call, {args.calls / wall:.0f} "
                    f"calls/s, load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        for n, tree in enumerate(trees):
            values = per_call[n]
            print(
                f"tree {n} {tree} ({args.mode} {args.route} c={args.concurrency}): median "
                f"{statistics.median(values):.3f} ms/call (min {min(values):.3f}, "
                f"max {max(values):.3f})"
            )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.stop()
        for log_file in logdir.glob("*.log"):
            text = log_file.read_text(errors="replace").strip()
            if text and "Traceback" in text:
                print(f"--- {log_file.name}\n{text[-2000:]}", file=sys.stderr)
        shutil.rmtree(logdir, ignore_errors=True)


if __name__ == "__main__":
    main()
