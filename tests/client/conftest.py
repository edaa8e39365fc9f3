"""Fixtures of the client's integration tests: a private Redis and real services on free ports.

The service is imported only by the fixtures that start one: the client's other tests also run
in environments that hold the client alone (test_client_light_install.py, Python 3.10/3.11).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from service_process import Service

    from sandbox_service.local.redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    """A private, throwaway redis-server."""
    from sandbox_service.local.redis_server import start_redis_server

    server = start_redis_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """A running service with default settings, shared by the tests of one module."""
    from service_process import Service

    log_path = tmp_path_factory.mktemp("service") / "up.log"
    running = Service(redis_server.url, log_path, uid_base=62400)
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def own_service(redis_server: RedisServer, tmp_path: Path) -> Iterator[Callable[..., Service]]:
    """Start a service of the test's own (settings as keyword arguments, e.g. max_queue_depth)."""
    from service_process import Service

    started: list[Service] = []

    def start(**settings: str) -> Service:
        # A queue of its own, so that its depth and its jobs are not another service's.
        settings.setdefault("queue_name", f"client-tests-{os.getpid()}-{len(started)}")
        log_path = tmp_path / f"up-{len(started)}.log"
        # Jail uids apart from the shared service's (62400-62401) and from each other's.
        uid_base = 62410 + 10 * len(started)
        running = Service(redis_server.url, log_path, uid_base, **settings)
        started.append(running)
        running.start()
        return running

    try:
        yield start
    finally:
        for running in started:
            running.stop()
