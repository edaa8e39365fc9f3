"""A private `rl-sandbox up` on a free loopback port: the one launcher that tests, `rl-sandbox
bench`, `make loadtest`, the scripts and the trainer (rl/) use.

The child runs in its own process group and dies with us (procs.spawn), and `up` ties its own
children (Redis, workers, API) to its life, so nothing outlives the caller even on SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from sandbox_service.local import procs

READY_TIMEOUT_S = 120.0
"""Generous: a cold start imports and preloads one zygote per worker on a loaded machine."""


def service_env(settings: Mapping[str, str], *, inherit_settings: bool = False) -> dict[str, str]:
    """The environment of a private service: ours without Redis URLs, plus `settings` (names as
    Settings fields, e.g. `workers`). With `inherit_settings`, RL_SANDBOX_* variables already in
    our environment are kept and win over `settings` (which are then defaults)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("REDIS_URL", "RL_SANDBOX_REDIS_URL")
        and (inherit_settings or not key.startswith("RL_SANDBOX_"))
    }
    for name, value in settings.items():
        key = f"RL_SANDBOX_{name.upper()}"
        if inherit_settings:
            env.setdefault(key, value)
        else:
            env[key] = value
    return env


class PrivateService:
    """One `rl-sandbox up` process tree on 127.0.0.1, as a context manager; it can be stopped
    (SIGTERM drains, SIGKILL crashes) and started again on the same port."""

    def __init__(
        self,
        settings: Mapping[str, str],
        *,
        log_path: Path | None = None,
        inherit_settings: bool = False,
        port: int | None = None,
        workers: int | None = None,
    ) -> None:
        self.port = port if port is not None else procs.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.env = service_env(settings, inherit_settings=inherit_settings)
        self.workers = workers
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self, ready_timeout_s: float = READY_TIMEOUT_S) -> Self:
        """Start it and wait until /readyz answers 200; RuntimeError (with the log's end) if not."""
        argv = [sys.executable, "-m", "sandbox_service.cli", "up", "--port", str(self.port)]
        if self.workers is not None:
            argv += ["--workers", str(self.workers)]
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as log:
                self.process = procs.spawn(argv, self.env, stdout=log, stderr=subprocess.STDOUT)
        else:  # the banner would break a progress bar; logs stay on stderr
            self.process = procs.spawn(argv, self.env, stdout=subprocess.DEVNULL)
        try:
            procs.wait_ready(self.url, ready_timeout_s, self.process)
        except procs.NotReady as exc:
            self.stop()
            raise RuntimeError(f"rl-sandbox up did not start ({exc}):\n{self.log_tail()}") from exc
        return self

    @property
    def pid(self) -> int:
        """The `up` process (its descendants are the stack)."""
        if self.process is None:
            raise RuntimeError("the private service is not running")
        return self.process.pid

    def stop(self, sig: signal.Signals = signal.SIGTERM, grace_s: float = 60.0) -> None:
        """Stop it: SIGTERM drains in order, SIGKILL is a crash; then wait for the port."""
        process, self.process = self.process, None
        if process is None:
            return
        if sig == signal.SIGTERM:
            procs.stop([process], grace_s=grace_s)
        else:
            if process.poll() is None:
                process.send_signal(sig)
            procs.stop([process], grace_s=grace_s)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _listening(self.port):
            time.sleep(0.1)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the service's log ("" without a log file)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
