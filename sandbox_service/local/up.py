"""`rl-sandbox up`: the whole service on this machine, with no configuration.

A private redis-server (when no REDIS_URL is set), the worker supervisor (one worker per core by
default) and the API, each a child process tied to this one. Ctrl-C or SIGTERM stops them in the
order that loses nothing: the API first (it drains its in-flight requests, which the workers
finish), then the workers, then Redis. No process is left behind, even if this one is killed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import urllib.request

from sandbox_service.local import procs
from sandbox_service.local.redis_server import RedisServer, start_redis_server
from sandbox_service.logs import configure_logging, fields
from sandbox_service.settings import Settings

log = logging.getLogger(__name__)


def up(settings: Settings, host: str, port: int) -> int:
    """Run Redis (if needed), workers and the API until a signal or a child's death."""
    configure_logging("up", settings.log_level)
    stop = procs.stop_event()
    env = dict(os.environ)
    redis_server: RedisServer | None = None
    if settings.redis_url is None:
        redis_server = start_redis_server(unix_socket=True)
        env["RL_SANDBOX_REDIS_URL"] = redis_server.url
        log.info("private redis started", extra=fields(url=redis_server.url))
    env["RL_SANDBOX_WORKERS"] = str(settings.workers)
    cli = [sys.executable, "-m", "sandbox_service.cli"]
    workers = procs.spawn([*cli, "worker"], env)
    api = procs.spawn([*cli, "api", "--host", host, "--port", str(port)], env)
    children: dict[str, subprocess.Popen[bytes]] = {"api": api, "workers": workers}
    log.info(
        "rl-sandbox up",
        extra=fields(
            url=f"http://{host}:{port}", workers=settings.workers, docs=f"http://{host}:{port}/docs"
        ),
    )
    print(
        f"rl-sandbox: starting the API on http://{host}:{port} and {settings.workers} workers"
        " (their jails preload the scientific stack: seconds; `ready` follows)",
        flush=True,
    )
    status = 0
    ready_url = f"http://{_loopback(host)}:{port}/readyz"
    announced = False
    while not stop.wait(0.2):
        if not announced and _ready(ready_url):
            announced = True
            print(
                f"rl-sandbox: ready on http://{host}:{port} (API reference: /docs; readiness:"
                " /readyz); Ctrl-C stops everything",
                flush=True,
            )
        dead = {
            name: child.returncode for name, child in children.items() if child.poll() is not None
        }
        if dead:
            log.error("a component exited; stopping", extra=fields(exited=dead))
            status = 1
            break
    grace_s = settings.shutdown_grace_s + 5.0
    procs.stop([api], grace_s)
    procs.stop([workers], grace_s)
    if redis_server is not None:
        redis_server.stop()
    log.info("rl-sandbox stopped")
    return status


def _loopback(host: str) -> str:
    """The address this host reaches the API at (a wildcard listen is reached on loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def _ready(url: str) -> bool:
    """Whether /readyz answers 200 (the API is up and a worker is alive)."""
    try:
        with urllib.request.urlopen(url, timeout=0.5) as response:
            return bool(response.status == 200)
    except (OSError, ValueError):
        return False
