"""SandboxFusion's `/run_code` wire format (verl's sandbox tool and reward) mapped onto ours (pure).

Models follow SandboxFusion's `RunCodeRequest`, `RunCodeResponse` and `CommandRunResult` field for
field (casing included: `memory_limit_MB`); like SandboxFusion they ignore unknown fields, and a
`language` outside its 29 names is a 422. Only `python` runs here; the other names are answered
`SandboxError` with a message, which is what SandboxFusion answers for a language it has no runner
for. Our ExecuteResult maps onto the response as SandboxFusion's own `parse_run_status` would:

    our status      status        run_result.status   return_code        message
    ok              Success       Finished            0                  ""
    error           Failed        Finished            exit code          ""
    memory_limit    Failed        Finished            exit code or -sig  ""
    killed          Failed        Finished            -signal            ""
    timeout         Failed        TimeLimitExceeded   null               ""
    sandbox_error   SandboxError  Error               null               why
    queue_timeout   SandboxError  (run_result null)   -                  why; the code never ran

A negative return code for a signal is what SandboxFusion's asyncio subprocess reports. Python has
no compile step, so `compile_result` is always null and `compile_timeout` is unused.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from sandbox_service.api.validation import Problem, check_request
from sandbox_service.execution import Status
from sandbox_service.models import ExecuteRequest, ExecuteResult
from sandbox_service.settings import Settings

Language = Literal[
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript",
    "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest",
    "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket",
]  # fmt: skip
"""SandboxFusion's languages; any other value is a 422, as there."""

RUNNABLE_LANGUAGES = ("python",)
"""Languages this server runs; SandboxFusion accepts no alias for them."""

SKIPPED_FILE_MARK = "IGNORE_THIS_FILE"
"""SandboxFusion does not write input files whose path contains this."""

RunStatus = Literal["Success", "Failed", "SandboxError"]
CommandRunStatus = Literal["Finished", "Error", "TimeLimitExceeded"]


class RunCodeRequest(BaseModel):
    """One program to run (SandboxFusion's `RunCodeRequest`)."""

    compile_timeout: float = 10
    """Seconds; unused for python, which has no compile step."""
    run_timeout: float = 10
    """Wall-clock limit in seconds; capped at the server's max_timeout."""
    memory_limit_MB: int = -1
    """Megabytes; -1 (or any value <= 0): the server's max_memory_mb."""
    code: str
    stdin: str | None = None
    language: Language
    files: dict[str, str | None] = {}
    """Relative path -> base64 content; null contents are skipped, as in SandboxFusion."""
    fetch_files: list[str] = []
    args: list[str] = []
    """Extra arguments for SandboxFusion's pytest mode; accepted and unused."""


class CommandRunResult(BaseModel):
    """One command's outcome (SandboxFusion's `CommandRunResult`)."""

    status: CommandRunStatus
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    """SandboxFusion's `RunCodeResponse`; `message` is filled only for SandboxError."""

    status: RunStatus
    message: str
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = {}


class Unsupported(Exception):
    """The language is one of SandboxFusion's but has no runner here."""


def to_execute_request(request: RunCodeRequest, settings: Settings) -> ExecuteRequest:
    """Our request for a /run_code body; raises Unsupported, or InvalidRequest with its problems."""
    if request.language not in RUNNABLE_LANGUAGES:
        raise Unsupported(
            f"language {request.language!r} is not supported by this server; "
            f"supported: {', '.join(RUNNABLE_LANGUAGES)}"
        )
    if request.run_timeout <= 0:
        raise InvalidRequest(
            [_problem("run_timeout", "run_timeout must be greater than 0", request.run_timeout)]
        )
    memory_mb = request.memory_limit_MB if request.memory_limit_MB > 0 else settings.max_memory_mb
    files = {
        path: content
        for path, content in request.files.items()
        if content is not None and SKIPPED_FILE_MARK not in path
    }
    try:
        execute = ExecuteRequest(
            code=request.code,
            stdin=request.stdin or "",
            timeout=min(request.run_timeout, settings.max_timeout),
            memory_mb=min(max(memory_mb, 16), settings.max_memory_mb),
            files=files,
            fetch_files=request.fetch_files,
        )
    except ValidationError as exc:  # paths or base64 of files / fetch_files; same names there
        raise InvalidRequest(
            [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors(include_url=False)]
        ) from None
    problems = check_request(execute, settings, ("body",))
    if problems:
        raise InvalidRequest(problems)
    return execute


class InvalidRequest(Exception):
    """The body cannot run here: 422 with FastAPI-style problems naming SandboxFusion's fields."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(problems)
        self.problems = problems


def _problem(field: str, message: str, value: Any) -> Problem:
    return {"type": "value_error", "loc": ["body", field], "msg": message, "input": value}


def sandbox_error(message: str) -> RunCodeResponse:
    """The answer when nothing ran, or the sandbox itself failed."""
    return RunCodeResponse(status="SandboxError", message=message)


def to_run_code_response(result: ExecuteResult) -> RunCodeResponse:
    """SandboxFusion's response for one execution (see the table in the module doc)."""
    status = Status(result.status)
    if status is Status.QUEUE_TIMEOUT:
        return sandbox_error(f"queue_timeout: {result.stderr}; the code never ran, safe to retry")
    if status is Status.SANDBOX_ERROR:
        failed = CommandRunResult(status="Error", stderr=result.stderr)
        return RunCodeResponse(status="SandboxError", message=result.stderr, run_result=failed)
    run = CommandRunResult(
        status="TimeLimitExceeded" if status is Status.TIMEOUT else "Finished",
        execution_time=result.wall_time,
        return_code=None if status is Status.TIMEOUT else _return_code(result),
        stdout=result.stdout,
        stderr=result.stderr,
    )
    return RunCodeResponse(
        status="Success" if status is Status.OK else "Failed",
        message="",
        run_result=run,
        files=result.files,
    )


def _return_code(result: ExecuteResult) -> int:
    if result.exit_code is not None:
        return result.exit_code
    # Ended by a signal (memory limit kill, seccomp, segfault): asyncio's negative convention.
    return -(result.signal or 9)
