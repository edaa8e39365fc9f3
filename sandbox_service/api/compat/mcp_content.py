"""What an MCP `python` tool call answers, from our ExecuteResult (pure; no MCP import).

The text a model reads: stdout (a session cell's last expression is printed there), then stderr
(the traceback of an uncaught exception), then a line naming a status other than ok or error
(timeout, memory_limit...). Figures come back as PNG images beside it.
"""

from __future__ import annotations

import math

from sandbox_service.api.compat.mcp_handshake import STATELESS_DESCRIPTION, TOOL_DESCRIPTION
from sandbox_service.execution import Status
from trainer_client.wire import ExecuteResult

__all__ = ["STATELESS_DESCRIPTION", "TOOL_DESCRIPTION"]

MIN_TOOL_TIMEOUT_S = 0.1


def tool_timeout(timeout: float, default_s: float, max_timeout_s: float) -> float:
    """The time limit of a tool call: the asked one clamped to [0.1 s, max_timeout_s]; the
    default for NaN (JSON-RPC arguments may carry NaN or Infinity, and a NaN limit never ends)."""
    if math.isnan(timeout):
        timeout = default_s
    return min(max(timeout, MIN_TOOL_TIMEOUT_S), max_timeout_s)


def tool_text(result: ExecuteResult) -> str:
    """The text part of the answer."""
    parts = [result.stdout, result.stderr]
    status = Status(result.status)
    if status not in (Status.OK, Status.ERROR):
        parts.append(f"[status: {status}]\n")
    text = "".join(part if part.endswith("\n") or not part else part + "\n" for part in parts)
    return text or "[no output]\n"


def tool_images(result: ExecuteResult) -> list[str]:
    """The base64 PNGs of the figures the code displayed, in order."""
    return [item["image/png"] for item in result.display if "image/png" in item]


def is_error(result: ExecuteResult) -> bool:
    """Whether MCP's `isError` is set: the code did not complete."""
    return Status(result.status) is not Status.OK
