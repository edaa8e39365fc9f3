"""Fixtures: a private Redis, and real service stacks (RQ workers with real jails, the API)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from sandbox_service.local.redis_server import RedisServer, start_redis_server
from tests.service.stack import Stack, stack_env
from tests.signal_handlers import changed_handlers, kept_signal_handlers, restore, signal_handlers

DEFAULT_LIMITS = {
    "max_code_bytes": 4096,
    "max_batch": 8,
    "max_body_bytes": 1024 * 1024,
    "max_files_bytes": 4096,
    "max_output_bytes": 4096,
    "max_timeout": 20,
    "max_memory_mb": 2048,
}
"""Small server limits, so that going over them is cheap to test."""


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service-logs")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server on a free loopback port (never the machine's 6379)."""
    server = start_redis_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    """The shared stack: two workers and an API with small limits."""
    env = stack_env(redis_server.url, "main", 62500, **DEFAULT_LIMITS, math_zygote=True)
    running = Stack(env, logs_dir / "main.log").start()
    yield running
    running.stop()


@pytest.fixture
async def client(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
        yield http


@pytest.fixture(autouse=True)
def no_leaked_signal_handlers() -> Iterator[None]:
    """Fails a test that leaves the pytest process's signal handlers changed (and restores
    them, so the next test is not hit): a test running an RQ worker in-process must use
    `in_process_worker_signals`."""
    before = signal_handlers()
    yield
    # SIGALRM is pytest-timeout's: it takes its handler off itself when a test fails.
    leaked = [name for name in changed_handlers(before, signal_handlers()) if name != "SIGALRM"]
    restore(before)
    assert not leaked, f"the test left signal handlers installed for {', '.join(leaked)}"


@pytest.fixture
def in_process_worker_signals() -> Iterator[None]:
    """For a test that runs an RQ worker in the pytest process: the signal handlers it
    installs are removed after the test."""
    with kept_signal_handlers():
        yield
