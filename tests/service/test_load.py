"""Thousands of requests in flight through one API process, each getting its own result."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.service.stack import Stack

CONCURRENT = 2000


@pytest.mark.slow
async def test_2000_concurrent_requests_each_get_their_own_output(stack: Stack) -> None:
    limits = httpx.Limits(max_connections=CONCURRENT, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=stack.url, timeout=300, limits=limits) as client:

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
