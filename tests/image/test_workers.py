"""Scaling the worker containers, and losing one under load: no execution may be lost.

Runs last in tests/image (it changes the stack's shape, then puts it back).
"""

from __future__ import annotations

import concurrent.futures
import time

import httpx

from tests.image import stack as podman_stack
from tests.image.stack import Stack

SLOTS_PER_CONTAINER = 2
SCALE_TIMEOUT_S = 180.0


def scale(stack: Stack, workers: int) -> None:
    """compose's --scale for the worker service, then wait for that many containers' slots."""
    podman_stack.compose("up", "--detach", "--no-build", "--scale", f"worker={workers}")
    wait_workers(stack, containers=workers)


def wait_workers(stack: Stack, containers: int) -> None:
    deadline = time.monotonic() + SCALE_TIMEOUT_S
    want = containers * SLOTS_PER_CONTAINER
    while time.monotonic() < deadline:
        running = podman_stack.containers("worker")
        if len(running) == containers and podman_stack.worker_count(stack.url) == want:
            return
        time.sleep(1.0)
    raise AssertionError(
        f"wanted {containers} worker containers ({want} slots), have {running} and "
        f"{podman_stack.worker_count(stack.url)} slots alive"
    )


def batch(stack: Stack, count: int, sleep_s: float) -> list[dict[str, object]]:
    code = "import time, sys\ntime.sleep({s})\nprint({i})"
    requests = [{"code": code.format(s=sleep_s, i=i), "timeout": 30} for i in range(count)]
    reply = httpx.post(f"{stack.url}/execute/batch", json={"requests": requests}, timeout=280)
    assert reply.status_code == 200, reply.text
    results: list[dict[str, object]] = reply.json()["results"]
    return results


def assert_all_ran(results: list[dict[str, object]]) -> None:
    wrong = [
        (i, r["status"], r["stdout"]) for i, r in enumerate(results) if r["stdout"] != f"{i}\n"
    ]
    assert not wrong, f"{len(wrong)} of {len(results)} lost or wrong: {wrong[:5]}"


def test_scale_to_two_stop_one_under_load_and_back(compose_stack: Stack) -> None:
    scale(compose_stack, 2)
    assert_all_ran(batch(compose_stack, 16, 0.1))
    victim = podman_stack.containers("worker")[-1]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        load = pool.submit(batch, compose_stack, 48, 0.5)
        time.sleep(3.0)
        # SIGTERM with compose's grace: the worker finishes its jobs and leaves the queue.
        podman_stack.podman("stop", "--time", "90", victim, timeout_s=120)
        assert_all_ran(load.result(timeout=280))
    assert victim not in podman_stack.containers("worker")
    scale(compose_stack, 1)
    assert_all_ran(batch(compose_stack, 8, 0.0))


def test_a_worker_killed_under_load_loses_nothing(compose_stack: Stack) -> None:
    scale(compose_stack, 2)
    victim = podman_stack.containers("worker")[-1]
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        load = pool.submit(batch, compose_stack, 32, 0.5)
        time.sleep(3.0)
        # SIGKILL: its running jobs die with it; the API sees the heartbeat stop and re-runs them.
        podman_stack.podman("kill", "--signal", "KILL", victim)
        assert_all_ran(load.result(timeout=280))
    scale(compose_stack, 1)
    assert_all_ran(batch(compose_stack, 8, 0.0))
