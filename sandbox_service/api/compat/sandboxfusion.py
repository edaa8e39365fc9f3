"""SandboxFusion's `/run_code` wire format (verl's sandbox tool and reward) mapped onto ours (pure).

Models follow SandboxFusion's `RunCodeRequest`, `RunCodeResponse` and `CommandRunResult` field for
field (casing included: `memory_limit_MB`); like SandboxFusion they ignore unknown fields, and a
`language` outside its 29 names is a 422. `python`, `cpp`, `java`, `nodejs` and `bash` run here
(jail/languages.py: Java as SandboxFusion runs it, `javac` then `java -ea`, javatuples on the class
path); the other names are answered `SandboxError` with a message, which is what SandboxFusion
answers for a language it has no runner for. Our ExecuteResult maps onto the response as
SandboxFusion's own `parse_run_status` would:

    our status      status        run_result.status   return_code        message
    ok              Success       Finished            0                  ""
    error           Failed        Finished            exit code          ""
    memory_limit    Failed        Finished            exit code or -sig  ""
    killed          Failed        Finished            -signal            ""
    timeout         Failed        TimeLimitExceeded   null               ""
    sandbox_error   SandboxError  Error               null               why
    queue_timeout   SandboxError  (run_result null)   -                  why; the code never ran
    cancelled       SandboxError  (run_result null)   -                  why (cancelled: ...)
    deadline_exc.   SandboxError  (run_result null)   -                  why (deadline_...)

A negative return code for a signal is what SandboxFusion's asyncio subprocess reports. Python has
no compile step (nor have `nodejs` and `bash`), so its `compile_result` is null. A `cpp` or `java`
program's compile step is the `compile_result` (Finished with the compiler's return code and
messages, or TimeLimitExceeded); one that did not compile is Failed with no `run_result`, as
SandboxFusion answers. The compile limit is the server's `compile_timeout_s`, not the request's
`compile_timeout`.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from sandbox_service.api.validation import Problem, check_request
from sandbox_service.execution import Status
from sandbox_service.settings import Settings
from trainer_client.wire import (
    ABSOLUTE_PATHS,
    INFRASTRUCTURE_STATUSES,
    MIN_TIMEOUT_S,
    ExecuteRequest,
    ExecuteResult,
)

Language = Literal[
    "python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript",
    "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest",
    "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket",
]  # fmt: skip
"""SandboxFusion's languages; any other value is a 422, as there."""

RUNNABLE_LANGUAGES = {
    "python": "python",
    "cpp": "cpp",
    "java": "java",
    "nodejs": "javascript",
    "bash": "bash",
}
"""SandboxFusion's languages this server runs -> our `language` (SandboxFusion's own aliases
`js` and `ts` are refused by its request model, so here too)."""

SKIPPED_FILE_MARK = "IGNORE_THIS_FILE"
"""SandboxFusion does not write input files whose path contains this."""

FINITE = ConfigDict(allow_inf_nan=False)
"""Unknown fields ignored, as SandboxFusion does; NaN and Infinity (or 1e999) refused in every
number: no limit of SandboxFusion's means anything with them, and JSON (RFC 8259) has none."""

RunStatus = Literal["Success", "Failed", "SandboxError"]
CommandRunStatus = Literal["Finished", "Error", "TimeLimitExceeded"]


class RunCodeRequest(BaseModel):
    """One program to run (SandboxFusion's `RunCodeRequest`)."""

    model_config = FINITE
    compile_timeout: float = 10
    """Seconds; accepted and unused: a compile has the server's compile_timeout_s."""
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
    if request.run_timeout < MIN_TIMEOUT_S:
        message = f"run_timeout must be at least {MIN_TIMEOUT_S}"
        raise InvalidRequest([_problem("run_timeout", message, request.run_timeout)])
    files = {
        path: content
        for path, content in request.files.items()
        if content is not None and SKIPPED_FILE_MARK not in path
    }
    execute = jail_request(
        code=request.code,
        language=RUNNABLE_LANGUAGES[request.language],
        stdin=request.stdin or "",
        timeout=min(request.run_timeout, settings.max_timeout),
        memory_mb=memory_mb_of(request.memory_limit_MB, settings),
        files=files,
        fetch_files=request.fetch_files,
    )
    problems = check_request(execute, settings, ("body",))
    if problems:
        raise InvalidRequest(problems)
    return execute


def memory_mb_of(memory_limit_mb: int, settings: Settings) -> int:
    """Our memory_mb for SandboxFusion's memory_limit_MB (<= 0: no limit, so the server's)."""
    memory_mb = memory_limit_mb if memory_limit_mb > 0 else settings.max_memory_mb
    return min(max(memory_mb, 16), settings.max_memory_mb)


def jail_request(**fields: Any) -> ExecuteRequest:
    """An ExecuteRequest whose files may name absolute paths in the jail's writable directories
    (SandboxFusion's clients write `/mnt/...`); InvalidRequest naming the field otherwise."""
    try:
        return ExecuteRequest.model_validate(fields, context={ABSOLUTE_PATHS: True})
    except ValidationError as exc:  # paths or base64 of files / fetch_files; same names there
        raise InvalidRequest(
            [{**e, "loc": ["body", *e["loc"]]} for e in exc.errors(include_url=False)]
        ) from None


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
    if status in (Status.CANCELLED, Status.DEADLINE_EXCEEDED):
        return sandbox_error(f"{status}: {result.stderr.strip()}")
    if status is Status.SANDBOX_ERROR:
        failed = CommandRunResult(status="Error", stderr=result.stderr)
        return RunCodeResponse(status="SandboxError", message=result.stderr, run_result=failed)
    compiled = _compile_result(result)
    if result.compile is not None and Status(result.compile.status) is not Status.OK:
        return RunCodeResponse(status="Failed", message="", compile_result=compiled)
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
        compile_result=compiled,
        run_result=run,
        files=result.files,
    )


def _compile_result(result: ExecuteResult) -> CommandRunResult | None:
    """A compiled program's compile step, as SandboxFusion reports it (None for the others)."""
    step = result.compile
    if step is None:
        return None
    timed_out = Status(step.status) is Status.TIMEOUT
    return CommandRunResult(
        status="TimeLimitExceeded" if timed_out else "Finished",
        execution_time=step.wall_time,
        return_code=None if timed_out else (step.exit_code if step.exit_code is not None else -9),
        stdout=step.stdout,
        stderr=step.stderr,
    )


def _return_code(result: ExecuteResult) -> int:
    if result.exit_code is not None:
        return result.exit_code
    # Ended by a signal (memory limit kill, seccomp, segfault): asyncio's negative convention.
    return -(result.signal or 9)


# --- /run_jupyter ---------------------------------------------------------------------------
#
# SandboxFusion runs the cells in a fresh Jupyter kernel per request; here they run as cells of
# one session (a persistent interpreter in its own jail), ended with the request. Per cell:
#
#     cell outcome                         answer
#     ran (ok, or raised: `error` set)     its CellRunResult; the next cell runs
#     out of time (cell or total)          Failed, driver TimeLimitExceeded, no cells (as there)
#     the interpreter died (signal, exit)  Failed, driver Finished with the return code, no cells
#     queue_timeout, sandbox_error         SandboxError with the reason
#
# A cell's value is printed by our sessions (and displayed): Jupyter only displays it, so the
# printed line is taken off the cell's stdout; likewise the traceback our interpreter prints to
# stderr for an uncaught exception is Jupyter's `error`, not stderr.


class RunJupyterRequest(BaseModel):
    """Cells to run in order in one interpreter (SandboxFusion's `RunJupyterRequest`)."""

    model_config = FINITE
    cells: list[str]
    cell_timeout: float = 0
    """Seconds per cell; 0: no limit of its own (SandboxFusion never enforces it; we do)."""
    total_timeout: float = 45
    """Seconds for all the cells together."""
    memory_limit_MB: int = -1
    """Megabytes of the interpreter (SandboxFusion ignores it; we apply it, as on /run_code)."""
    kernel: Literal["python3"] = "python3"
    files: dict[str, str] = {}
    fetch_files: list[str] = []


class CellRunResult(BaseModel):
    """One cell's outputs (SandboxFusion's `CellRunResult`)."""

    stdout: str
    stderr: str
    display: list[dict[str, Any]]
    """Mime bundles: the cell value's {"text/plain": repr} with its rich representations
    (text/html, ...), figures' {"image/png": base64}."""
    error: list[dict[str, Any]]
    """At most one {"ename", "evalue", "traceback": [lines]}."""


class RunJupyterResponse(BaseModel):
    """SandboxFusion's `RunJupyterResponse`."""

    status: RunStatus
    message: str
    driver: CommandRunResult | None = None
    cells: list[CellRunResult] = []
    executor_pod_name: str | None = None
    files: dict[str, str] = {}


def jupyter_session_id() -> str:
    """A session of its own for one /run_jupyter request."""
    return f"run-jupyter-{uuid.uuid4()}"


def cell_timeout_s(request: RunJupyterRequest, elapsed_s: float, settings: Settings) -> float:
    """The next cell's time limit: its own, what is left of the total, the server's maximum.
    Under MIN_TIMEOUT_S: no time left, the request is out of time (see `out_of_time`)."""
    left = request.total_timeout - elapsed_s
    if request.cell_timeout > 0:
        left = min(left, request.cell_timeout)
    return min(left, settings.max_timeout)


def cell_request(
    request: RunJupyterRequest, index: int, timeout_s: float, session_id: str, settings: Settings
) -> ExecuteRequest:
    """Cell `index` as a session cell; the input files go with the first, fetching with the last.
    InvalidRequest (a 422 naming SandboxFusion's field) when it cannot run here."""
    last = index == len(request.cells) - 1
    cell = jail_request(
        code=request.cells[index],
        timeout=timeout_s,
        memory_mb=memory_mb_of(request.memory_limit_MB, settings),
        session_id=session_id,
        files=request.files if index == 0 else {},
        fetch_files=request.fetch_files if last else [],
    )
    problems = check_request(cell, settings, ("body",))
    if problems:
        for problem in problems:
            if problem["loc"][-1] == "code":
                problem["loc"] = ["body", "cells", index]
        raise InvalidRequest(problems)
    return cell


def check_jupyter_request(request: RunJupyterRequest, settings: Settings) -> None:
    """InvalidRequest for a request that cannot run here, before any cell runs."""
    if request.total_timeout < MIN_TIMEOUT_S:
        message = f"total_timeout must be at least {MIN_TIMEOUT_S}"
        raise InvalidRequest([_problem("total_timeout", message, request.total_timeout)])
    if request.cell_timeout != 0 and request.cell_timeout < MIN_TIMEOUT_S:
        message = f"cell_timeout must be 0 (no limit of its own) or at least {MIN_TIMEOUT_S}"
        raise InvalidRequest([_problem("cell_timeout", message, request.cell_timeout)])
    if len(request.cells) > settings.max_cells:
        message = f"{len(request.cells)} cells; at most {settings.max_cells}"
        raise InvalidRequest([_problem("cells", message, None)])
    for index in range(len(request.cells)):
        cell_request(request, index, 1.0, "check", settings)


def to_cell_result(result: ExecuteResult) -> CellRunResult | None:
    """The cell's outputs; None when the cell did not complete in a live interpreter."""
    status = Status(result.status)
    if status in (Status.TIMEOUT, *INFRASTRUCTURE_STATUSES):
        return None
    if result.signal is not None:
        return None  # the interpreter was killed
    if status is not Status.OK and result.error is None:
        return None  # it exited (os._exit) without an exception of the cell
    stdout, stderr = result.stdout, result.stderr
    values = [item["text/plain"] for item in result.display if "text/plain" in item]
    if values:
        stdout = stdout.removesuffix(values[-1] + "\n")
    errors: list[dict[str, Any]] = []
    if result.error is not None:
        stderr = stderr.removesuffix("".join(result.error.traceback))
        errors.append(result.error.model_dump())
    return CellRunResult(stdout=stdout, stderr=stderr, display=result.display, error=errors)


def jupyter_failure(result: ExecuteResult, index: int, elapsed_s: float) -> RunJupyterResponse:
    """The answer when cell `index` did not complete (see the table above)."""
    status = Status(result.status)
    if status is Status.QUEUE_TIMEOUT:
        message = f"queue_timeout: {result.stderr}; cell {index} never ran, safe to retry"
        return RunJupyterResponse(status="SandboxError", message=message)
    if status in (Status.SANDBOX_ERROR, Status.CANCELLED, Status.DEADLINE_EXCEEDED):
        return RunJupyterResponse(status="SandboxError", message=result.stderr)
    if status is Status.TIMEOUT:
        driver = CommandRunResult(status="TimeLimitExceeded", execution_time=elapsed_s)
        return RunJupyterResponse(status="Failed", message="", driver=driver)
    why = f"cell {index} ended the interpreter ({result.status})"
    driver = CommandRunResult(
        status="Finished",
        execution_time=elapsed_s,
        return_code=_return_code(result),
        stdout="",
        stderr=why,
    )
    return RunJupyterResponse(status="Failed", message="", driver=driver)


def jupyter_out_of_time(elapsed_s: float) -> RunJupyterResponse:
    """The answer when the total time ran out between cells."""
    driver = CommandRunResult(status="TimeLimitExceeded", execution_time=elapsed_s)
    return RunJupyterResponse(status="Failed", message="", driver=driver)


def jupyter_success(
    cells: list[CellRunResult], files: dict[str, str], elapsed_s: float
) -> RunJupyterResponse:
    """Every cell ran (some may have raised: that is in their `error`, as in Jupyter)."""
    driver = CommandRunResult(
        status="Finished", execution_time=elapsed_s, return_code=0, stdout="", stderr=""
    )
    return RunJupyterResponse(status="Success", message="", driver=driver, cells=cells, files=files)
