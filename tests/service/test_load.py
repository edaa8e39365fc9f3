"""Thousands of requests in flight through one API process, each getting its own result."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandbox_service.local.redis_server import RedisServer
from tests.service.stack import Stack, stack_env

CONCURRENT = 2000


@pytest.fixture(scope="module")
def patient(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    """A stack whose queue deadline outlasts 2,000 calls on two loaded cores: this test is about
    every request getting its own answer, not about how fast (a shared CI machine may be slow)."""
    env = stack_env(
        redis_server.url, "load", 63500, queue_deadline_s=600, client_response_margin_s=700
    )
    running = Stack(env, logs_dir / "load.log").start()
    yield running
    running.stop()


@pytest.mark.slow
async def test_2000_concurrent_requests_each_get_their_own_output(patient: Stack) -> None:
    limits = httpx.Limits(max_connections=CONCURRENT, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=patient.url, timeout=900, limits=limits) as client:

        async def one(i: int) -> tuple[int, dict[str, object]]:
            response = await client.post("/execute", json={"code": f"print({i} * 7)"})
            return response.status_code, response.json()

        answers = await asyncio.gather(*(one(i) for i in range(CONCURRENT)))
    assert [code for code, _ in answers] == [200] * CONCURRENT
    wrong = [
        (i, result) for i, (_, result) in enumerate(answers)
        if (result["status"], result["stdout"]) != ("ok", f"{i * 7}\n")
    ]  # fmt: skip
    assert wrong == []
    assert len({result["id"] for _, result in answers}) == CONCURRENT
