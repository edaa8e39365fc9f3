"""`rl-sandbox worker-health`, the worker container's health check, against real workers."""

from __future__ import annotations

import subprocess
import sys

from tests.service.stack import Stack


def _worker_health(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "sandbox_service.cli", "worker-health"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_healthy_while_a_worker_of_this_host_beats(stack: Stack) -> None:
    done = _worker_health(stack.env)
    assert done.returncode == 0, done.stderr


def test_unhealthy_with_the_reason_when_no_worker_beats(stack: Stack) -> None:
    env = {**stack.env, "RL_SANDBOX_QUEUE_NAME": "rlst-no-such-queue"}
    done = _worker_health(env)
    assert done.returncode == 1
    assert "no worker of" in done.stderr


def test_unhealthy_without_redis(stack: Stack) -> None:
    env = {**stack.env, "RL_SANDBOX_REDIS_URL": "redis://127.0.0.1:1/0"}
    done = _worker_health(env)
    assert done.returncode == 1
    assert "Redis unreachable" in done.stderr
