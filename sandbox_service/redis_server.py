"""A private redis-server child on a loopback port, without persistence (for `up` and tests)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

import redis

from sandbox_service import procs


@dataclass
class RedisServer:
    """A running private redis-server."""

    process: subprocess.Popen[bytes]
    port: int
    workdir: str

    @property
    def url(self) -> str:
        """Its redis:// URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Stop it (its data is gone: there is no persistence)."""
        procs.stop([self.process], grace_s=5.0)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_redis_server(port: int | None = None, binary: str = "redis-server") -> RedisServer:
    """Start redis-server on 127.0.0.1:port (a free one by default) and wait until it answers."""
    port = port or procs.free_port()
    workdir = tempfile.mkdtemp(prefix="rl-sandbox-redis-")
    argv = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
        "--save", "", "--appendonly", "no", "--dir", workdir, "--daemonize", "no",
        "--maxclients", "10000", "--loglevel", "warning",
    ]  # fmt: skip
    process = procs.spawn(argv, stdout=subprocess.DEVNULL)
    server = RedisServer(process, port, workdir)
    client = redis.Redis(port=port, socket_connect_timeout=0.5)
    deadline = time.monotonic() + 10.0
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"redis-server did not start on port {port}") from None
            time.sleep(0.02)
        finally:
            client.close()
    return server
