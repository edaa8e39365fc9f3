"""`rl-sandbox up`: everything from one command, and nothing left behind when it stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from sandbox_service.local import procs
from sandbox_service.local.procs import free_port
from tests.service.stack import stack_env, tail


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    try:
        procs.wait_ready(url, 90, process)
    except procs.NotReady as exc:
        raise AssertionError(f"{exc}:\n{tail(log)}") from exc


def cmdline(process: psutil.Process) -> list[str]:
    """The command line, or nothing for a short-lived process already gone or a zombie."""
    try:
        return process.cmdline()
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return []


def gone(processes: list[psutil.Process], timeout_s: float = 30) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_up_runs_everything_and_leaves_nothing_behind(logs_dir: Path, stop_signal: int) -> None:
    env = stack_env("unused", f"up{stop_signal}", 63100 + 10 * stop_signal, workers=1)
    del env["RL_SANDBOX_REDIS_URL"]  # `up` starts its own Redis
    port = free_port()
    log = logs_dir / f"up-{stop_signal}.log"
    with log.open("ab") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "sandbox_service.cli", "up", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, up, log)
        result = httpx.post(f"{url}/execute", json={"code": "print(6 * 7)"}, timeout=30).json()
        assert (result["status"], result["stdout"]) == ("ok", "42\n")
        children = descendants(up.pid)
        names = " ".join(" ".join(cmdline(p)) for p in children)
        assert "redis-server" in names and " api " in names and " worker" in names
        os.kill(up.pid, stop_signal)
        up.wait(timeout=60)
        if stop_signal != signal.SIGKILL:
            assert up.returncode == 0, tail(log)
        assert gone(children) == []
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
