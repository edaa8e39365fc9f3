"""One compose stack for the whole tests/image session: built, started, torn down.

The images are built first (scripts/image/build.sh: cached, so a second run rebuilds nothing),
then deploy/compose.yaml is started with podman-compose and waited for until /readyz answers.
Teardown runs on success, failure, Ctrl-C and SIGTERM, and a stack left by a run that was killed
outright is removed before the next one starts.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from types import FrameType

import pytest

from tests.image import stack

if os.environ.get("RL_SANDBOX_IMAGE_TEST") != "1":
    # Builds images and runs containers for minutes: only `make image-test` (which sets it) runs
    # this directory, not `make test` (docs/deploy.md, "Try it with podman or Docker", says why).
    collect_ignore_glob = ["test_*.py"]


def _require_tools() -> None:
    tools = ("podman", "runc", "debootstrap", "patchelf")
    missing = [tool for tool in tools if not shutil.which(tool)]
    if missing:
        pytest.fail(f"tests/image needs {', '.join(missing)}: run `make image-test`", False)


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session")
def images() -> dict[str, float]:
    """Build (or reuse) the base, API, worker and Redis images; the build's seconds.

    `make image-test` builds them just before (image-build) and says so: a build with nothing to
    do still costs podman some 10 s an image here.
    """
    _require_tools()
    start = time.monotonic()
    if os.environ.get("IMAGE_TEST_PREBUILT") != "1":
        subprocess.run([str(stack.SCRIPTS / "build.sh")], cwd=stack.ROOT, check=True, timeout=1800)
    return {"build_s": time.monotonic() - start}


@pytest.fixture(scope="session")
def compose_stack(images: dict[str, float]) -> Iterator[stack.Stack]:
    """deploy/compose.yaml running, ready (Redis and a worker alive); removed afterwards."""
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    stack.teardown()
    try:
        stack.compose("up", "--detach", "--no-build", timeout_s=300.0)
        assert stack.api_port() == stack.API_PORT
        url = f"http://127.0.0.1:{stack.API_PORT}"
        stack.wait_ready(url)
        (redis,) = stack.containers("redis")
        yield stack.Stack(url=url, redis_address=stack.address_of(redis))
    finally:
        stack.teardown()
        signal.signal(signal.SIGTERM, previous)
    left = stack.leftovers()
    assert not left, f"teardown left {left}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test of tests/image pays for the build and start-up: give it the time."""
    mine = [item for item in items if "tests/image/" in item.nodeid]
    for index, item in enumerate(mine):
        item.add_marker(pytest.mark.timeout(1800 if index == 0 else 300))
