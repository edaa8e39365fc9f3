"""Open MCP sessions are charged to their tenant (api/compat/mcp_routes.py): each streamable-HTTP
session lives in the API process until its DELETE or 30 minutes idle, so one tenant opening
them must fill only its weight's share of `max_mcp_sessions`, never another tenant's room.

Old behaviour this fails on: the SDK's one process-wide limit; amber's sessions filled it and
birch's `initialize` was answered 503 until amber's sessions went idle for 30 minutes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from sandbox_service.local.redis_server import RedisServer
from tests.service.stack import Stack, stack_env

TENANTS = """
[[tenant]]
name = "amber"
key = "key-amber-0123456789"

[[tenant]]
name = "birch"
key = "key-birch-0123456789"
weight = 3
"""
AMBER = {"Authorization": "Bearer key-amber-0123456789"}
BIRCH = {"Authorization": "Bearer key-birch-0123456789"}
MAX_MCP_SESSIONS = 8
"""Amber's share 2 (weight 1 of 4), birch's 6."""
MCP_HEADERS = {"Accept": "application/json, text/event-stream"}
MCP_VERSION = "2025-06-18"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": MCP_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "mcp-session-shares", "version": "0"},
    },
}


@pytest.fixture(scope="module")
def mcp_stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    path = logs_dir / "mcp-session-shares.toml"
    path.write_text(TENANTS)
    env = stack_env(
        redis_server.url, "mcp-shares", 66400, workers=1, max_mcp_sessions=MAX_MCP_SESSIONS
    )
    stack = Stack({**env, "RL_SANDBOX_TENANTS_FILE": str(path)}, logs_dir / "mcp-shares.log")
    yield stack.start()
    stack.stop()


@pytest.fixture
async def http(mcp_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=mcp_stack.url, timeout=60) as client:
        yield client


async def open_session(http: httpx.AsyncClient, key: dict[str, str]) -> httpx.Response:
    return await http.post("/mcp", json=INITIALIZE, headers={**key, **MCP_HEADERS})


async def close_session(http: httpx.AsyncClient, key: dict[str, str], session: str) -> None:
    headers = {**key, **MCP_HEADERS, "mcp-session-id": session, "mcp-protocol-version": MCP_VERSION}
    assert (await http.delete("/mcp", headers=headers)).status_code == 200


async def test_a_tenant_fills_only_its_share_of_open_mcp_sessions(
    http: httpx.AsyncClient,
) -> None:
    ambers = []
    for _ in range(2):
        opened = await open_session(http, AMBER)
        assert opened.status_code == 200, opened.text
        ambers.append(opened.headers["mcp-session-id"])
    for _ in range(3):  # past amber's share: refused, and nothing is opened
        refused = await open_session(http, AMBER)
        assert refused.status_code == 429, refused.text
        assert "max_mcp_sessions" in refused.text and "retry-after" in refused.headers
    birchs = []
    for _ in range(6):  # birch's whole share stays open to it
        opened = await open_session(http, BIRCH)
        assert opened.status_code == 200, opened.text
        birchs.append(opened.headers["mcp-session-id"])
    assert (await open_session(http, BIRCH)).status_code == 429
    # A session ended gives its room back to its own tenant.
    await close_session(http, AMBER, ambers.pop())
    reopened = await open_session(http, AMBER)
    assert reopened.status_code == 200, reopened.text
    ambers.append(reopened.headers["mcp-session-id"])
    for session in ambers:
        await close_session(http, AMBER, session)
    for session in birchs:
        await close_session(http, BIRCH, session)
