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
        f"rl-sandbox: API on http://{host}:{port} (docs: /docs), {settings.workers} workers;"
        " Ctrl-C stops everything",
        flush=True,
    )
    status = 0
    while not stop.wait(0.2):
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
