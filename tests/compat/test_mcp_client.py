"""Acceptance: the MCP Python SDK's client (mcp 1.x, as vLLM, open-instruct and verifiers install
it; our server is mcp 2.x) calls rl-sandbox's tools over streamable HTTP at /mcp, SSE at
/mcp/sse and stdio (`rl-sandbox mcp`), against a running service with an API key."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from sandbox_service.local.redis_server import RedisServer
from tests.compat.client_env import MCP_REQUIREMENTS, client_python, run_driver
from tests.service.stack import Stack, stack_env

API_KEY = "compat-mcp-key"


@pytest.fixture(scope="module")
def seen(
    compat_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    log = tmp_path_factory.mktemp("mcp-logs") / "stack.log"
    env = stack_env(compat_redis.url, "mcp", 64500, workers=2, api_key=API_KEY, max_timeout=30)
    stack = Stack(env, log).start()
    try:
        python = client_python("mcp", MCP_REQUIREMENTS)
        driver_env = {
            "MCP_URL": f"{stack.url}/mcp",
            "MCP_SERVICE": stack.url,
            "MCP_KEY": API_KEY,
            "MCP_COMMAND": str(Path(sys.executable).parent / "rl-sandbox"),
        }
        seen = run_driver(python, "mcp_calls.py", driver_env)
        seen["sessions_left"] = _sessions_left(compat_redis.url, env["RL_SANDBOX_QUEUE_NAME"])
        yield seen
    finally:
        stack.stop()


def _sessions_left(redis_url: str, queue: str) -> list[str]:
    """The sessions of ours still kept, once their MCP sessions' ends have been handled."""
    client = redis.Redis.from_url(redis_url)
    deadline = time.monotonic() + 20
    while True:
        left = sorted(key.decode() for key in client.scan_iter(f"{queue}:session:*"))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.parametrize("transport", ["http_", "sse_", "stdio_"])
def test_python_tools(seen: dict[str, Any], transport: str) -> None:
    assert seen[transport + "tools"] == ["python", "python_stateless"]
    assert seen[transport + "stateful"] == "42\n"
    assert seen[transport + "stateless_error"] is True
    assert "NameError: name 'x' is not defined" in seen[transport + "stateless_text"]
    assert seen[transport + "image_types"] == ["image/png"]
    assert seen[transport + "image_magic"] == ["89504e470d0a1a0a"]
    is_error, text = seen[transport + "error"]
    assert is_error is True and text.endswith("ZeroDivisionError: division by zero\n")


def test_sessions_are_per_mcp_session_and_keyed(seen: dict[str, Any]) -> None:
    assert seen["new_session_lacks_x"] is True
    assert seen["sse_new_session_lacks_x"] is True
    assert seen["server_name"] == "python"  # vLLM's tool namespace


def test_a_closed_mcp_session_ends_its_session(seen: dict[str, Any]) -> None:
    # streamable HTTP's DELETE, a closed SSE stream, and stdio's end each ended theirs
    assert seen["sessions_left"] == []
    assert seen["no_key"] != "accepted" and "401" in seen["no_key"]
