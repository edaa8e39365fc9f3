"""rl-sandbox trainer client: micro-batched, retrying async client and tool-calling helpers."""

from sandbox_service.models import ExecuteRequest, ExecuteResult
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
from trainer_client.http import Timeouts
from trainer_client.retry import RetryPolicy
from trainer_client.stats import ClientStats, LatencySummary
from trainer_client.sync import SyncSandboxClient
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
)

__all__ = [
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
    "InvalidRequestError",
    "LatencySummary",
    "LoopClock",
    "RetriesExhaustedError",
    "RetryPolicy",
    "SandboxClient",
    "SandboxClientError",
    "ServiceError",
    "SyncSandboxClient",
    "Timeouts",
    "ToolCall",
    "VirtualClock",
    "build_request",
    "execute_tool_call",
    "format_parse_error",
    "format_tool_response",
    "jupyter_tool_schema",
    "parse_tool_calls",
    "python_tool_schema",
    "truncate_middle",
]
