"""A private `rl-sandbox up` for one training run: started before, stopped after.

It gets its own Redis (REDIS_URL is removed from its environment), its own port, cgroup parent,
queue and jail uids, so it can run beside other services on the host. It dies with the trainer
(PR_SET_PDEATHSIG), even when the trainer is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

READY_TIMEOUT_S = 90.0
_PR_SET_PDEATHSIG = 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent() -> None:
    # Not Linux: no prctl, and the trainer's finally still stops the service.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class LocalService:
    """`rl-sandbox up` on a free port, as a context manager."""

    def __init__(self, log_path: Path, *, workers: int = 2, uid_base: int = 64000) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        tag = f"rl-train-{os.getpid()}"
        self.env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL",)}
        self.env.pop("RL_SANDBOX_REDIS_URL", None)
        self.env.update(
            {
                "RL_SANDBOX_WORKERS": str(workers),
                "RL_SANDBOX_CGROUP_PARENT": tag,
                "RL_SANDBOX_QUEUE_NAME": tag,
                "RL_SANDBOX_SANDBOX_UID_BASE": str(uid_base),
                "RL_SANDBOX_LOG_LEVEL": "WARNING",
                "RL_SANDBOX_SHUTDOWN_GRACE_S": "5",
            }
        )
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start it and wait until /readyz answers 200."""
        argv = [sys.executable, "-m", "sandbox_service.cli", "up", "--port", str(self.port)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                argv,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"rl-sandbox up exited early; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=1.0) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(
            f"rl-sandbox up not ready after {READY_TIMEOUT_S} s; see {self.log_path}"
        )

    def stop(self) -> None:
        """SIGTERM (the service drains and stops its children), SIGKILL if it hangs."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
