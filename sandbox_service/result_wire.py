"""Conversions between the wire models and the internal execution values."""

from __future__ import annotations

import base64

from sandbox_service.execution import ExecutionResult
from sandbox_service.models import ExecuteResult


def result_to_wire(result: ExecutionResult, restored: bool = False) -> ExecuteResult:
    """The API's ExecuteResult of an internal ExecutionResult (file contents base64-encoded)."""
    return ExecuteResult(
        id=result.execution_id,
        status=result.status.value,
        exit_code=result.exit_code,
        signal=result.signal,
        stdout=result.stdout,
        stderr=result.stderr,
        stdout_truncated=result.stdout_truncated,
        stderr_truncated=result.stderr_truncated,
        wall_time=result.wall_time,
        cpu_time=result.cpu_time,
        peak_memory_mb=result.peak_memory_mb,
        queue_time=result.queue_time,
        files={path: base64.b64encode(data).decode() for path, data in result.files.items()},
        restored=restored,
    )
