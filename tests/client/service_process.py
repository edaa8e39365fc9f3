"""A real rl-sandbox as a child process tree: `rl-sandbox up` on a free port, Redis given.

Redis is started by the fixtures (conftest.py) rather than by `up`, so that a test can kill the
service (API and workers) and start it again on the same port while the queue survives, as in a
real deployment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from sandbox_service.local.procs import NotReady, free_port, wait_ready

READY_TIMEOUT_S = 60.0


class Service:
    """One `rl-sandbox up` process tree, which the test can stop and start again."""

    def __init__(self, redis_url: str, log_path: Path, uid_base: int, **settings: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        # Nothing inherited may configure it: only what is set here.
        inherited = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("RL_SANDBOX_") and k != "REDIS_URL"
        }
        self.env = {
            **inherited,
            "RL_SANDBOX_REDIS_URL": redis_url,
            "RL_SANDBOX_WORKERS": "2",
            # A cgroup parent and jail uids of its own: other services (tests/service uses uids
            # 62500 and up, engineers' own services 62000 and up) may run on this host meanwhile.
            "RL_SANDBOX_CGROUP_PARENT": "rl-sandbox-client-tests",
            "RL_SANDBOX_SANDBOX_UID_BASE": str(uid_base),
            "RL_SANDBOX_LOG_LEVEL": "WARNING",
            "RL_SANDBOX_SHUTDOWN_GRACE_S": "5",
            **{f"RL_SANDBOX_{name.upper()}": value for name, value in settings.items()},
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the service and wait until /readyz says it is ready."""
        argv = [sys.executable, "-m", "sandbox_service.cli", "up", "--port", str(self.port)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            wait_ready(self.url, READY_TIMEOUT_S, self.process)
        except NotReady as exc:
            self.stop()
            raise RuntimeError(f"rl-sandbox up did not start ({exc}):\n{self.log_tail()}") from exc

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop it: SIGTERM drains in order; SIGKILL is a crash (its children die with it)."""
        if self.process is None:
            return
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        # `up` ties its children to its life; wait until the port is free again.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _listening(self.port):
            time.sleep(0.1)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the service's log."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
