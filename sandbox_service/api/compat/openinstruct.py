"""open-instruct's Python tool wire (open_instruct/environments/tools/tools.py, PythonCodeTool)
mapped onto ours (pure): `POST <api_endpoint>` with `{"code", "timeout"}`, answered
`{"output", "error", "success"}`; the tool shows `output`, then `error` when it is not empty.

Served at `POST /open-instruct/execute` (its `api_endpoint`); the program runs once, stateless,
as the tool's reference server runs it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sandbox_service.api.compat.nemo import encodable, seconds
from sandbox_service.execution import Status
from trainer_client.wire import ExecuteResult

PATH = "/open-instruct/execute"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A validated request."""

    code: str
    timeout_s: float


def parse_call(body: bytes, max_timeout_s: float) -> ToolCall | dict[str, Any]:
    """The call, or the 400 answer refusing it (in the tool's shape)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return answer("", "the body is not valid JSON")
    if not isinstance(data, dict) or not isinstance(data.get("code"), str):
        return answer("", "code must be a string")
    if not encodable(data["code"]):
        return answer("", "code must be valid Unicode (no lone surrogates)")
    timeout = seconds(data.get("timeout", 3))
    if timeout is None:
        return answer("", "timeout must be a finite number of seconds")
    if timeout <= 0:
        return answer("", "timeout must be greater than 0")
    return ToolCall(data["code"], min(timeout, max_timeout_s))


def answer(output: str, error: str | None) -> dict[str, Any]:
    """A response in the tool's shape."""
    return {"output": output, "error": error, "success": not error}


def to_answer(result: ExecuteResult, call: ToolCall) -> dict[str, Any]:
    """Our result: stdout as `output`; stderr (the traceback), or why it stopped, as `error`."""
    status = Status(result.status)
    error = result.stderr
    if status is Status.TIMEOUT:
        error += f"\nTimeout: the code ran past {call.timeout_s:g} seconds"
    elif status not in (Status.OK, Status.ERROR):
        error += f"\nthe program ended with status {status}"
    return answer(result.stdout, error.strip() or None)
