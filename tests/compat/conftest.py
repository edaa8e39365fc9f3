"""A real service for the peers' acceptance cases: private Redis, RQ workers with nsjail jails,
the API, all on loopback, with the server's default code-judge limits (10 s, as code-judge's
MAX_EXECUTION_TIME) and its own jail uids and cgroup names."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sandbox_service.local.redis_server import RedisServer, start_redis_server
from tests.service.stack import Stack, stack_env

WORKERS = 4
"""As many workers as code-judge's own test fixture starts (its /status test reads them)."""


@pytest.fixture(scope="session")
def compat_redis() -> Iterator[RedisServer]:
    server = start_redis_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def compat_stack(
    compat_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    log = tmp_path_factory.mktemp("compat-logs") / "stack.log"
    env = stack_env(compat_redis.url, "peers", 64300, workers=WORKERS, max_timeout=30)
    running = Stack(env, log).start()
    yield running
    running.stop()


@pytest.fixture
async def http(compat_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=compat_stack.url, timeout=90) as client:
        yield client


async def post_ok(http: httpx.AsyncClient, path: str, body: object) -> Any:
    """POST a JSON body; the JSON answer, which must be a 200."""
    response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()
