"""The MCP server's `initialize` answer without the SDK (pure, standard library only).

`rl-sandbox mcp` answers a host's `initialize` from here while the SDK (seconds to import on a
busy machine) loads; the SDK then serves the session, and its own answer to the same
`initialize` is dropped. tests/unit/test_mcp_handshake.py checks that this answer is the SDK's,
byte for byte, for every protocol version the handshake offers.
"""

from __future__ import annotations

import json
from typing import Any

from sandbox_service import __version__

SERVER_NAME = "python"
"""The server's name: vLLM takes it as the tool namespace, and `python` is the one gpt-oss's
built-in python tool calls."""
TOOL_DESCRIPTION = (
    "Run Python 3 code in a sandbox (no network). Variables, imports and files persist between "
    "calls of this conversation. The output is what the code prints; the value of the last "
    "expression is printed too; matplotlib figures come back as images."
)
STATELESS_DESCRIPTION = (
    "Run a Python 3 program in a fresh sandbox (no network, nothing kept between calls); "
    "answers what it prints, its errors, and matplotlib figures as images."
)
HANDSHAKE_PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
"""The SDK's (mcp_types.HANDSHAKE_PROTOCOL_VERSIONS): a host asking for another one is
answered by the SDK itself, once loaded."""
CAPABILITIES = {
    "prompts": {"listChanged": False},
    "resources": {"listChanged": False, "subscribe": False},
    "tools": {"listChanged": False},
}


def initialize_answer(message: Any) -> tuple[object, str] | None:
    """(request id, the JSON line that answers it) for an `initialize` request in a version the
    handshake offers; None for any other message (the SDK answers it)."""
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    request_id = message.get("id")
    params = message.get("params")
    if isinstance(request_id, bool) or not isinstance(request_id, (int, str)):
        return None
    if not isinstance(params, dict) or params.get("protocolVersion") not in (
        HANDSHAKE_PROTOCOL_VERSIONS
    ):
        return None
    result = {
        "capabilities": CAPABILITIES,
        "instructions": TOOL_DESCRIPTION,
        "protocolVersion": params["protocolVersion"],
        "serverInfo": {"name": SERVER_NAME, "version": __version__},
    }
    answer = {"jsonrpc": "2.0", "id": request_id, "result": result}
    return request_id, json.dumps(answer, separators=(",", ":"), ensure_ascii=False)
