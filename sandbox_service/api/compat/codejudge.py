"""code-judge's wire format (the rStar2-Agent trainer's sandbox), mapped onto ours (pure).

Models follow code-judge 0.0.5 (`app/model.py`) field for field; like code-judge they ignore
unknown fields. Its types are code-judge's (`python`, `cpp`, `math`) and, for the languages
code-judge does not run, /execute's names (`java`, `javascript`, `bash`). A submission becomes
an ExecuteRequest with the server's code-judge limits (code-judge has no per-request limits: its
MAX_EXECUTION_TIME and MAX_MEMORY are server-wide), and an ExecuteResult becomes a
SubmissionResult:

    our status      run_success  success                        reason          stdout/stderr
    ok              true         expected_output matches         ""              first 1000 chars
    error           false        false                           ""              first 1000 chars
    memory_limit    false        false                           ""              first 1000 chars
    killed          false        false                           ""              first 1000 chars
    timeout         false        false                           worker_timeout  + TIMEOUT_MARK
    queue_timeout   false        false                           queue_timeout   null
    sandbox_error   false        false                           internal_error  null
    cancelled       false        false                           internal_error  null
    deadline_exc.   false        false                           internal_error  null
    type `math`     false        false                           internal_error  null
    (cannot run)    false        false                           invalid_input   stderr says why
    cpp or java,    false        false                           ""              stderr: the
    compile error                                                                compiler's
                                                                                 messages, cost 0

`success` compares stripped stdout with stripped `expected_output` when one is given, as
code-judge does. Output is cut to code-judge's MAX_STDOUT_ERROR_LENGTH after the comparison, so
a trainer sees what it saw under code-judge. A run that failed after using its whole time limit
is a `worker_timeout` too (code-judge's API applies the same rule to `cost`), and so is one that
ended only at the limit: code-judge's alarm would have killed it there. The `/judge*` routes
answer the same results without stdout and stderr (JudgeResult).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sandbox_service.api.validation import check_request
from sandbox_service.execution import Status
from sandbox_service.settings import Settings
from trainer_client.wire import ExecuteRequest, ExecuteResult, validate_text

MAX_OUTPUT_CHARS = 1000
"""code-judge's MAX_STDOUT_ERROR_LENGTH: stdout and stderr are cut to this many characters."""

RUNNABLE_TYPES = ("python", "cpp", "java", "javascript", "bash")
"""Submission types this server runs (`cpp`: g++ -O2 in the jail, as code-judge compiles; the
languages code-judge lacks under /execute's names for them)."""

FAILING_TYPES = ("math",)
"""Types code-judge's schema accepts but its workers fail on (`internal_error`, cost 0)."""

TIMEOUT_MARK = "Suicide from timeout.\n"
"""What code-judge's in-script alarm handler prints when it kills a program at its time limit;
its clients (and its own tests) look for it in stdout."""

_FIELD_NAMES = {"code": "solution", "stdin": "input"}
"""Our request fields under their code-judge names, for invalid_input messages."""

Reason = Literal["", "worker_timeout", "queue_timeout", "internal_error", "invalid_input"]


class Submission(BaseModel):
    """One program (code-judge's `Submission`); `input` is its stdin."""

    model_config = ConfigDict(allow_inf_nan=False)  # unknown fields ignored, as in code-judge

    sub_id: str | None = None
    type: Literal["python", "cpp", "java", "javascript", "bash", "math"]
    options: dict[str, str] | None = None
    """Accepted and unused, as in code-judge."""
    solution: str
    input: str | None = None
    expected_output: str | None = None

    @field_validator("sub_id", "solution", "input", "expected_output")
    @classmethod
    def _encodable(cls, value: str | None) -> str | None:
        # JSON lets a lone surrogate through; it could not be run, compared or echoed back.
        return None if value is None else validate_text(value, "the text")


class SubmissionResult(BaseModel):
    """What happened to one submission (code-judge's `SubmissionResult`)."""

    sub_id: str
    success: bool
    run_success: bool
    cost: float
    """Seconds: the program's run time, or the time waited when it never ran."""
    stdout: str | None = None
    stderr: str | None = None
    reason: Reason = ""


class JudgeResult(BaseModel):
    """A SubmissionResult without the program's output (code-judge's `JudgeResult`, `/judge*`)."""

    sub_id: str
    success: bool
    run_success: bool
    cost: float
    reason: Reason = ""

    @classmethod
    def of(cls, result: SubmissionResult) -> JudgeResult:
        """The judging view of a result."""
        return cls.model_validate(result.model_dump(exclude={"stdout", "stderr"}))


class BatchSubmission(BaseModel):
    """Several submissions (code-judge's `BatchSubmission`)."""

    model_config = ConfigDict(allow_inf_nan=False)

    sub_id: str | None = None
    type: Literal["batch"] = "batch"
    submissions: list[Submission] = Field(min_length=1)


class BatchSubmissionResult(BaseModel):
    """Results in the order of the submissions (code-judge's `BatchSubmissionResult`)."""

    sub_id: str
    results: list[SubmissionResult]


class BatchJudgeResult(BaseModel):
    """Judging views in the order of the submissions (code-judge's `BatchJudgeResult`)."""

    sub_id: str
    results: list[JudgeResult]


class ServerStatus(BaseModel):
    """code-judge's `/status`: jobs waiting, workers alive (its client's `ServerStatus`)."""

    queue: int
    num_workers: int


@dataclass(frozen=True, slots=True)
class Planned:
    """A submission ready to run: the request, with what its result is compared against."""

    sub_id: str
    request: ExecuteRequest
    expected_output: str | None


def sub_id_of(sub_id: str | None) -> str:
    """The given id, or a fresh uuid4 string as code-judge makes when none (or "") is given."""
    return sub_id or str(uuid.uuid4())


def plan(submission: Submission, settings: Settings) -> Planned | SubmissionResult:
    """The request to run for a submission, or its `invalid_input` result when it cannot run."""
    sub_id = sub_id_of(submission.sub_id)
    if submission.type in FAILING_TYPES:
        return not_run(sub_id, "internal_error", 0.0)
    if submission.type not in RUNNABLE_TYPES:
        return invalid_input(
            sub_id,
            f"type {submission.type!r} is not supported by this server; "
            f"supported: {', '.join(RUNNABLE_TYPES)}",
        )
    try:
        request = ExecuteRequest(
            code=submission.solution,
            language=submission.type,
            stdin=submission.input or "",
            timeout=min(settings.codejudge_timeout_s, settings.max_timeout),
            memory_mb=min(settings.codejudge_memory_mb, settings.max_memory_mb),
        )
    except ValidationError as exc:  # text that is not valid Unicode (a lone surrogate)
        return invalid_input(sub_id, "; ".join(e["msg"] for e in exc.errors(include_url=False)))
    problems = check_request(request, settings, ())
    if problems:
        message = "; ".join(
            f"{_FIELD_NAMES.get(p['loc'][-1], p['loc'][-1])}: {p['msg']}" for p in problems
        )
        return invalid_input(sub_id, message)
    return Planned(sub_id, request, submission.expected_output)


def invalid_input(sub_id: str, message: str) -> SubmissionResult:
    """The result of a submission that was not run; `stderr` says why."""
    return SubmissionResult(
        sub_id=sub_id, success=False, run_success=False, cost=0.0, stderr=message,
        reason="invalid_input",
    )  # fmt: skip


def not_run(sub_id: str, reason: Reason, waited_s: float) -> SubmissionResult:
    """The result of a submission the service could not take (overload, Redis down)."""
    return SubmissionResult(
        sub_id=sub_id, success=False, run_success=False, cost=max(0.0, waited_s), reason=reason
    )


def to_submission_result(planned: Planned, result: ExecuteResult) -> SubmissionResult:
    """code-judge's result of one execution (see the table in the module doc)."""
    status = Status(result.status)
    if status is Status.QUEUE_TIMEOUT:
        return not_run(planned.sub_id, "queue_timeout", result.queue_time)
    if status in (Status.SANDBOX_ERROR, Status.CANCELLED, Status.DEADLINE_EXCEEDED):
        return not_run(planned.sub_id, "internal_error", result.wall_time)
    timed_out = status is Status.TIMEOUT or result.wall_time >= planned.request.timeout
    stdout = result.stdout + TIMEOUT_MARK if timed_out else result.stdout
    run_success = status is Status.OK and not timed_out
    success = run_success and (
        planned.expected_output is None or stdout.strip() == planned.expected_output.strip()
    )
    return SubmissionResult(
        sub_id=planned.sub_id,
        success=success,
        run_success=run_success,
        cost=result.wall_time,
        stdout=stdout[:MAX_OUTPUT_CHARS],
        stderr=result.stderr[:MAX_OUTPUT_CHARS],
        reason="worker_timeout" if timed_out else "",
    )
