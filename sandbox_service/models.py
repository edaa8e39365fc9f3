"""Wire models of the HTTP API (../spec/API.md): pydantic, used only at the HTTP edge."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sandbox_service.execution import Status

__all__ = [
    "BatchRequest",
    "BatchResponse",
    "ExecuteRequest",
    "ExecuteResult",
    "Status",
    "validate_relative_path",
]

SUPPORTED_LANGUAGES = ("python",)


def validate_relative_path(path: str) -> str:
    """Accept a relative path inside the working directory; reject absolute paths and `..`."""
    if not path or path.startswith("/") or "\x00" in path or "\\" in path:
        raise ValueError(f"path {path!r} must be a non-empty relative path")
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"path {path!r} must not contain empty, '.' or '..' components")
    if len(path) > 1024:
        raise ValueError("path longer than 1024 characters")
    return path


class ExecuteRequest(BaseModel):
    """One program to run."""

    model_config = ConfigDict(extra="forbid")

    code: str
    language: str = "python"
    stdin: str = ""
    timeout: Annotated[float, Field(gt=0)] = 10.0
    memory_mb: Annotated[int, Field(ge=16)] = 1024
    session_id: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    files: dict[str, str] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)

    @field_validator("language")
    @classmethod
    def _supported_language(cls, value: str) -> str:
        if value not in SUPPORTED_LANGUAGES:
            raise ValueError(
                f"language {value!r} is not supported; supported: {', '.join(SUPPORTED_LANGUAGES)}"
            )
        return value

    @field_validator("files")
    @classmethod
    def _files_are_relative_base64(cls, value: dict[str, str]) -> dict[str, str]:
        for path, content in value.items():
            validate_relative_path(path)
            try:
                base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ValueError(f"files[{path!r}] is not valid base64") from exc
        return value

    @field_validator("fetch_files")
    @classmethod
    def _fetch_files_are_relative(cls, value: list[str]) -> list[str]:
        for path in value:
            validate_relative_path(path)
        return value


class ExecuteResult(BaseModel):
    """What happened to one execution."""

    id: str
    status: Status
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_time: float = 0.0
    cpu_time: float = 0.0
    peak_memory_mb: float | None = None
    queue_time: float = 0.0
    files: dict[str, str] = Field(default_factory=dict)
    restored: bool = False
    """True when the session was rebuilt by replaying its earlier cells before this one ran."""


class BatchRequest(BaseModel):
    """Several programs, run in parallel across workers."""

    model_config = ConfigDict(extra="forbid")

    requests: list[ExecuteRequest] = Field(min_length=1)


class BatchResponse(BaseModel):
    """Results in the order of the requests."""

    results: list[ExecuteResult]
