"""`rl-sandbox mcp` answers `initialize` before the SDK is loaded: the answer must be the SDK's
own, byte for byte, and the session must go on as the SDK's (one answer per request)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mcp_types.version as mcp_types
import pytest

from sandbox_service.api.compat.mcp_handshake import HANDSHAKE_PROTOCOL_VERSIONS, initialize_answer

RL_SANDBOX = str(Path(sys.executable).parent / "rl-sandbox")
SDK_STDIO = """
import asyncio
from sandbox_service.api.compat.mcp_server import build_server
async def run(code, session, timeout, tenant):
    raise AssertionError("no tool is called")
asyncio.run(build_server(run, 60.0, "s").run_stdio_async())
"""


def initialize(version: str, request_id: object = 1) -> dict[str, object]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"},
        },
    }


def converse(command: list[str], messages: list[dict[str, object]], answers: int) -> list[str]:
    """Send the messages as JSON lines, read that many answer lines, close stdin."""
    env = {"RL_SANDBOX_URL": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"}
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
        proc.stdin.flush()
        lines = [proc.stdout.readline().decode().strip() for _ in range(answers)]
        proc.stdin.close()
        proc.wait(timeout=30)
        stderr = proc.stderr.read()
    assert stderr == b""  # WARNING unless asked: nothing to say here
    return lines


def test_the_handshake_versions_are_the_sdks() -> None:
    assert HANDSHAKE_PROTOCOL_VERSIONS == mcp_types.HANDSHAKE_PROTOCOL_VERSIONS


@pytest.mark.parametrize("version", HANDSHAKE_PROTOCOL_VERSIONS)
def test_the_early_answer_is_the_sdks(version: str) -> None:
    request = initialize(version, request_id="req-7")
    (sdk,) = converse([sys.executable, "-c", SDK_STDIO], [request], 1)
    early = initialize_answer(request)
    assert early is not None and early == ("req-7", sdk)


def test_other_messages_and_versions_are_left_to_the_sdk() -> None:
    assert initialize_answer(initialize("1999-01-01")) is None
    assert initialize_answer({"jsonrpc": "2.0", "id": 1, "method": "ping"}) is None
    assert initialize_answer(initialize("2025-06-18", request_id=True)) is None
    assert initialize_answer([1]) is None


def test_the_session_goes_on_with_one_answer_per_request() -> None:
    messages = [
        initialize("2025-06-18"),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "ping"},
    ]
    lines = converse([RL_SANDBOX, "mcp"], messages, 3)
    answers = [json.loads(line) for line in lines]
    assert [a["id"] for a in answers] == [1, 2, 3]
    assert answers[0]["result"]["serverInfo"]["name"] == "python"
    tools = [tool["name"] for tool in answers[1]["result"]["tools"]]
    assert tools == ["python", "python_stateless"]


def test_an_old_version_is_answered_by_the_sdk_once() -> None:
    lines = converse(
        [RL_SANDBOX, "mcp"],
        [initialize("1999-01-01"), {"jsonrpc": "2.0", "id": 2, "method": "ping"}],
        2,
    )
    answers = [json.loads(line) for line in lines]
    assert [a["id"] for a in answers] == [1, 2]
    assert answers[0]["result"]["protocolVersion"] == mcp_types.LATEST_PROTOCOL_VERSION or (
        answers[0]["result"]["protocolVersion"] == HANDSHAKE_PROTOCOL_VERSIONS[-1]
    )
