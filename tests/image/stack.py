"""The compose stack of deploy/compose.yaml, run with podman and podman-compose for tests/image.

Images come from scripts/image/build.sh (a local base image, no registry). Every podman command
reads scripts/image/containers.conf (runc, cgroupfs, explicit ulimits, a private cgroup
namespace). The stack has a project name of its own, so a stack left by a killed run is found
and removed before the next one starts, and teardown removes every container, network and
volume of that project whatever state the run ended in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from sandbox_service.local.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "image"
PROJECT = "rlsb-imagetest"
IMAGE_TAG = "imagetest"
READY_TIMEOUT_S = 240.0
COMPOSE = [sys.executable, "-m", "podman_compose"]
API_PORT = free_port()
"""The host port (loopback) the API is published on: never a fixed one another service may hold."""


def podman_env() -> dict[str, str]:
    """The environment of every podman and compose command of the tests."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(SCRIPTS / "containers.conf"))
    env.update(
        {
            "IMAGE_TAG": IMAGE_TAG,
            "REDIS_IMAGE": f"localhost/rl-sandbox-redis:{IMAGE_TAG}",
            "WORKER_SLOTS": "2",
            "API_PORT": str(API_PORT),
        }
    )
    return env


def run(argv: Sequence[str], timeout_s: float = 300.0, check: bool = True) -> str:
    """Run a command from the repository root; its stdout, or an error with its output."""
    done = subprocess.run(
        list(argv),
        cwd=ROOT,
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} exited {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done.stdout


def podman(*args: str, timeout_s: float = 120.0, check: bool = True) -> str:
    """A podman command (the tests' containers.conf)."""
    return run(["podman", *args], timeout_s=timeout_s, check=check)


def compose(*args: str, timeout_s: float = 300.0, check: bool = True) -> str:
    """A podman-compose command on deploy/compose.yaml, in this stack's project."""
    argv = [*COMPOSE, "-p", PROJECT, "-f", "deploy/compose.yaml", *args]
    return run(argv, timeout_s=timeout_s, check=check)


def containers(service: str | None = None, running_only: bool = True) -> list[str]:
    """Names of this project's containers (of one service), sorted."""
    args = ["ps", "--format", "{{.Names}}"]
    args += ["--filter", f"label=io.podman.compose.project={PROJECT}"]
    if service:
        args += ["--filter", f"label=com.docker.compose.service={service}"]
    if not running_only:
        args.append("--all")
    return sorted(line for line in podman(*args).split() if line)


def address_of(container: str) -> str:
    """The container's address on its first network."""
    info = json.loads(podman("inspect", container))[0]
    networks = info["NetworkSettings"]["Networks"]
    return str(next(iter(networks.values()))["IPAddress"])


def api_port() -> int:
    """The host port compose published the API on (loopback)."""
    (api,) = containers("api")
    out = podman("port", api, "8000/tcp").strip()
    return int(out.rsplit(":", 1)[1])


def teardown() -> None:
    """Remove everything of the project: containers, networks, volumes; never raises."""
    # --remove-orphans: podman-compose's down removes only the file's containers at scale 1.
    compose(
        "down", "--volumes", "--remove-orphans", "--timeout", "10", timeout_s=180.0, check=False
    )
    leftover = containers(running_only=False)
    if leftover:
        podman("rm", "--force", "--time", "5", *leftover, check=False)
    for network in podman("network", "ls", "--format", "{{.Name}}", check=False).split():
        if network.startswith(f"{PROJECT}_"):
            podman("network", "rm", "--force", network, check=False)


def leftovers() -> list[str]:
    """What of the project is still in podman: containers, networks and volumes, by name."""
    names = [f"container {name}" for name in containers(running_only=False)]
    for kind in ("network", "volume"):
        listed = podman(kind, "ls", "--format", "{{.Name}}", check=False).split()
        names += [f"{kind} {name}" for name in listed if name.startswith(f"{PROJECT}_")]
    return names


def logs(container: str, lines: int = 30) -> str:
    """The last lines a container wrote (stdout and stderr, as podman keeps them)."""
    done = subprocess.run(
        ["podman", "logs", container],
        env=podman_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        check=False,
    )
    return "\n".join(done.stdout.splitlines()[-lines:])


def wait_ready(url: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait until GET /readyz answers 200 (Redis and a worker alive), or raise with the logs."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            reply = httpx.get(f"{url}/readyz", timeout=5.0)
            if reply.status_code == 200:
                return
            last = f"{reply.status_code} {reply.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(1.0)
    tails = "\n".join(f"--- {name}\n{logs(name)}" for name in containers(running_only=False))
    raise RuntimeError(f"{url}/readyz not ready in {timeout_s:.0f} s: {last}\n{tails}")


def worker_count(url: str) -> int:
    """Worker processes alive, as /metrics reports them."""
    for line in httpx.get(f"{url}/metrics", timeout=5.0).text.splitlines():
        if line.startswith("rl_sandbox_workers_alive"):
            return int(float(line.split()[-1]))
    raise RuntimeError("/metrics has no rl_sandbox_workers_alive")


@dataclass(frozen=True, slots=True)
class Stack:
    """A running compose stack."""

    url: str
    """The API's base URL on the host's loopback."""
    redis_address: str
    """Redis's address on the backend network (what a jailed program must not reach)."""
