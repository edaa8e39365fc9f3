"""Real service processes for the tests: `rl-sandbox worker` and `rl-sandbox api` on loopback.

Each stack gets its own queue name, cgroup parent and jail uids, so stacks (and other engineers'
services on this host) never share an executor slot. Process output goes to a log file whose
tail is shown when a stack fails to start.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import redis

from sandbox_service.local.private import service_env
from sandbox_service.local.procs import free_port
from tests.host_tag import tagged

READY_TIMEOUT_S = 90.0


def stack_env(redis_url: str, name: str, uid_base: int, **settings: object) -> dict[str, str]:
    """The environment of one stack's processes (settings as RL_SANDBOX_<NAME>)."""
    defaults = {
        "redis_url": redis_url,
        "queue_name": f"rlst-{name}",
        "cgroup_parent": tagged(f"rl-sandbox-svctest-{name}"),
        "sandbox_uid_base": str(uid_base),
        "workers": "2",
        "log_level": "INFO",
        "shutdown_grace_s": "10",
        # Two zygotes a slot (lean and data): a stack starts sooner. The shared stack keeps the
        # default three (tests/service/conftest.py), so the math zygote is tested end to end.
        "math_zygote": "false",
    }
    return service_env({**defaults, **{key: str(value) for key, value in settings.items()}})


def spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """Start a CLI subcommand in its own session, output appended to log_path."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "sandbox_service.cli", *argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> int | None:
    """Signal a process, wait for it (30 s), kill it if needed; returns its exit status."""
    if process is None:
        return None
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


async def wait_list_length(client: redis.Redis, key: str, length: int) -> None:
    """Wait (up to 10 s) until the Redis list `key` (a queue) holds `length` items."""
    for _ in range(200):
        if client.llen(key) == length:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{key} never held {length} items (holds {client.llen(key)})")


def tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log file."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class Stack:
    """Workers and one API of a test stack."""

    def __init__(self, env: dict[str, str], log_path: Path, workers: bool = True) -> None:
        self.env = env
        self.log_path = log_path
        self.queue = env["RL_SANDBOX_QUEUE_NAME"]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers: subprocess.Popen[bytes] | None = None
        self.api: subprocess.Popen[bytes] | None = None
        self.with_workers = workers

    def start(self, ready: bool = True) -> Stack:
        """Start workers (if any) and the API; wait for /readyz (or just /healthz)."""
        if self.with_workers and self.workers is None:
            self.workers = spawn(["worker"], self.env, self.log_path)
        self.start_api()
        try:
            self.wait("/readyz" if ready else "/healthz")
        except BaseException:
            self.stop()
            raise
        return self

    def start_api(self) -> None:
        """Start (or restart) the API process on this stack's port."""
        self.api = spawn(["api", "--port", str(self.port)], self.env, self.log_path)

    def wait(self, path: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until GET path answers 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in (("api", self.api), ("workers", self.workers)):
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{name} exited early:\n{tail(self.log_path)}")
            try:
                key = self.env.get("RL_SANDBOX_API_KEY")
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                if httpx.get(f"{self.url}{path}", headers=headers, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.url}{path} not 200 after {timeout_s} s:\n{tail(self.log_path)}")

    def stop(self) -> None:
        """Stop the API, then the workers."""
        stop(self.api)
        stop(self.workers)
        self.api = self.workers = None


def api_with_tenants(env: dict[str, str], api_env: dict[str, str], log: Path) -> Iterator[Stack]:
    """Workers on `env` and an API on `env` + `api_env` (its tenants file, keys): the tenants an
    API publishes are the ones its queue's workers serve, so each such stack has its own.
    A fixture's body: `yield from api_with_tenants(...)`."""
    workers = spawn(["worker"], env, log)
    api = Stack({**env, **api_env}, log, workers=False)
    try:
        yield api.start()
    finally:
        api.stop()
        stop(workers)
