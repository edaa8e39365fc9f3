"""rl-sandbox trainer client: micro-batched, retrying async client and tool-calling helpers.

The names below are imported on first use (PEP 562): `import trainer_client.wire`, which the
service does for the wire models, loads pydantic only, not httpx or the client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_client.client import SandboxClient, build_request
    from trainer_client.clock import Clock, LoopClock, VirtualClock
    from trainer_client.errors import (
        CallFailedError,
        CallInfo,
        ClientClosedError,
        DeadlineExceededError,
        InvalidRequestError,
        RetriesExhaustedError,
        SandboxClientError,
        ServiceError,
    )
    from trainer_client.grade_wire import GradeRequest, GradeResult
    from trainer_client.group import Group
    from trainer_client.http import Timeouts
    from trainer_client.retry import RetryPolicy
    from trainer_client.session import Session
    from trainer_client.stats import ClientStats, LatencySummary
    from trainer_client.sync import SyncGroup, SyncSandboxClient, SyncSession
    from trainer_client.tools import (
        JUPYTER_TOOL_NAME,
        PYTHON_TOOL_NAME,
        ToolCall,
        execute_tool_call,
        format_parse_error,
        format_tool_response,
        jupyter_tool_schema,
        parse_tool_calls,
        python_tool_schema,
        truncate_middle,
        truncate_to_tokens,
    )
    from trainer_client.wire import (
        INFRASTRUCTURE_STATUSES,
        ExecuteRequest,
        ExecuteResult,
        GroupCancelled,
        VerifyItem,
        VerifyResult,
    )

_EXPORTS = {
    "CallFailedError": "trainer_client.errors",
    "CallInfo": "trainer_client.errors",
    "ClientClosedError": "trainer_client.errors",
    "ClientStats": "trainer_client.stats",
    "Clock": "trainer_client.clock",
    "DeadlineExceededError": "trainer_client.errors",
    "ExecuteRequest": "trainer_client.wire",
    "GradeRequest": "trainer_client.grade_wire",
    "GradeResult": "trainer_client.grade_wire",
    "Group": "trainer_client.group",
    "GroupCancelled": "trainer_client.wire",
    "INFRASTRUCTURE_STATUSES": "trainer_client.wire",
    "ExecuteResult": "trainer_client.wire",
    "InvalidRequestError": "trainer_client.errors",
    "JUPYTER_TOOL_NAME": "trainer_client.tools",
    "LatencySummary": "trainer_client.stats",
    "LoopClock": "trainer_client.clock",
    "PYTHON_TOOL_NAME": "trainer_client.tools",
    "RetriesExhaustedError": "trainer_client.errors",
    "RetryPolicy": "trainer_client.retry",
    "SandboxClient": "trainer_client.client",
    "SandboxClientError": "trainer_client.errors",
    "ServiceError": "trainer_client.errors",
    "Session": "trainer_client.session",
    "SyncSandboxClient": "trainer_client.sync",
    "SyncGroup": "trainer_client.sync",
    "SyncSession": "trainer_client.sync",
    "Timeouts": "trainer_client.http",
    "ToolCall": "trainer_client.tools",
    "VerifyItem": "trainer_client.wire",
    "VerifyResult": "trainer_client.wire",
    "VirtualClock": "trainer_client.clock",
    "build_request": "trainer_client.client",
    "execute_tool_call": "trainer_client.tools",
    "format_parse_error": "trainer_client.tools",
    "format_tool_response": "trainer_client.tools",
    "jupyter_tool_schema": "trainer_client.tools",
    "parse_tool_calls": "trainer_client.tools",
    "python_tool_schema": "trainer_client.tools",
    "truncate_middle": "trainer_client.tools",
    "truncate_to_tokens": "trainer_client.tools",
}
"""Public name -> the module that defines it."""


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "INFRASTRUCTURE_STATUSES",
    "JUPYTER_TOOL_NAME",
    "PYTHON_TOOL_NAME",
    "CallFailedError",
    "CallInfo",
    "ClientClosedError",
    "ClientStats",
    "Clock",
    "DeadlineExceededError",
    "ExecuteRequest",
    "ExecuteResult",
    "GradeRequest",
    "GradeResult",
    "Group",
    "GroupCancelled",
    "InvalidRequestError",
    "LatencySummary",
    "LoopClock",
    "RetriesExhaustedError",
    "RetryPolicy",
    "SandboxClient",
    "SandboxClientError",
    "ServiceError",
    "Session",
    "SyncGroup",
    "SyncSandboxClient",
    "SyncSession",
    "Timeouts",
    "ToolCall",
    "VerifyItem",
    "VerifyResult",
    "VirtualClock",
    "build_request",
    "execute_tool_call",
    "format_parse_error",
    "format_tool_response",
    "jupyter_tool_schema",
    "parse_tool_calls",
    "python_tool_schema",
    "truncate_middle",
    "truncate_to_tokens",
]
