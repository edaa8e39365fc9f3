"""A private redis-server child on a loopback port, without persistence (for `up` and tests).

`rl-sandbox up` also gives it a unix socket and hands that to its API and workers: every Redis
round trip of a call (about seven) then skips the loopback TCP stack, which costs measurably more
CPU per round trip here (docs/performance.md). Tests that restart Redis at the same address use
the TCP port.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass

import redis

from sandbox_service.local import procs


@dataclass
class RedisServer:
    """A running private redis-server."""

    process: subprocess.Popen[bytes]
    port: int
    workdir: str
    unix_socket: str | None = None
    """Path of its unix socket (mode 0700: root's processes only), when it has one."""

    @property
    def url(self) -> str:
        """Its URL: the unix socket when it has one, else TCP on loopback."""
        if self.unix_socket is not None:
            return f"unix://{self.unix_socket}?db=0"
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """Stop it (its data is gone: there is no persistence)."""
        procs.stop([self.process], grace_s=5.0)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_redis_server(
    port: int | None = None, binary: str = "redis-server", unix_socket: bool = False
) -> RedisServer:
    """Start redis-server on 127.0.0.1:port (a free one by default), and on a unix socket in its
    private directory if asked; wait until it answers."""
    port = port or procs.free_port()
    workdir = tempfile.mkdtemp(prefix="rl-sandbox-redis-")
    argv = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
        "--save", "", "--appendonly", "no", "--dir", workdir, "--daemonize", "no",
        "--maxclients", "10000", "--loglevel", "warning",
    ]  # fmt: skip
    socket_path = f"{workdir}/redis.sock" if unix_socket else None
    if socket_path is not None:
        argv += ["--unixsocket", socket_path, "--unixsocketperm", "700"]
    process = procs.spawn(argv, stdout=subprocess.DEVNULL)
    server = RedisServer(process, port, workdir, socket_path)
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
