"""The JSON of `POST /grade` and `POST /grade/batch` (spec: "Sealed grading"), shared by the client
and the service (which imports it from here)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator

from trainer_client.wire import (
    GROUP_PATTERN,
    MAX_DEADLINE_S,
    MIN_TIMEOUT_S,
    SEED_BOUND,
    WIRE_CONFIG,
    CompileResult,
    validate_text,
)

GradeStatus = Literal["graded", "queue_timeout", "sandbox_error", "cancelled", "deadline_exceeded"]
CaseStatus = Literal["passed", "failed", "error", "timeout", "memory_limit", "killed", "early_exit"]
MAX_NAME_CHARS = 100


class StdioCase(BaseModel):
    """One input and the output it must produce."""

    model_config = WIRE_CONFIG

    stdin: str = ""
    expected_stdout: str


class StdioTests(BaseModel):
    """Run the program per case; compare its stdout outside the jail."""

    model_config = WIRE_CONFIG

    kind: Literal["stdio"]
    cases: list[StdioCase] = Field(min_length=1)


# The wire's field `kwargs` clashes, for mypy's pydantic plugin, with its __init__'s **kwargs.
class FunctionCase(BaseModel):  # type: ignore[no-redef]
    """One call of the entry point and the value it must return."""

    model_config = WIRE_CONFIG

    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    expected: Any = None


class FunctionTests(BaseModel):
    """Call `entry_point` (or `Solution().entry_point`) per case, in a fresh process."""

    model_config = WIRE_CONFIG

    kind: Literal["function"]
    entry_point: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    cases: list[FunctionCase] = Field(min_length=1)

    @field_validator("entry_point")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not value.isidentifier():
            raise ValueError(f"entry_point {value!r} is not a Python identifier")
        return value


class AssertsTests(BaseModel):
    """Each assert is a case, evaluated outside the candidate's jail."""

    model_config = WIRE_CONFIG

    kind: Literal["asserts"]
    entry_points: list[Annotated[str, Field(max_length=MAX_NAME_CHARS)]] | None = None
    setup: str = ""
    asserts: list[str] = Field(min_length=1)

    @field_validator("entry_points")
    @classmethod
    def _identifiers(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if not name.isidentifier():
                raise ValueError(f"entry_points: {name!r} is not a Python identifier")
        return value

    @field_validator("setup")
    @classmethod
    def _encodable(cls, value: str) -> str:
        return validate_text(value, "setup")


Tests = Annotated[StdioTests | FunctionTests | AssertsTests, Field(discriminator="kind")]


class GradeRequest(BaseModel):
    """A candidate program and the tests that decide its reward."""

    model_config = WIRE_CONFIG

    language: Literal["python", "cpp"] = "python"
    code: str
    tests: Tests
    timeout: Annotated[float, Field(ge=MIN_TIMEOUT_S)] = 10.0
    """Per case, as in /execute."""
    memory_mb: Annotated[int, Field(ge=16)] = 1024
    group: Annotated[str, Field(pattern=GROUP_PATTERN)] | None = None
    deadline_s: Annotated[float, Field(gt=0, le=MAX_DEADLINE_S, allow_inf_nan=False)] | None = None
    seed: Annotated[int, Field(ge=0, lt=SEED_BOUND, strict=True)] | None = None
    """Seeds every run of the grading (null: 0, so that an `asserts` case replays the same)."""

    @field_validator("code")
    @classmethod
    def _encodable(cls, value: str) -> str:
        return validate_text(value, "the code")


class GradeBatchRequest(BaseModel):
    """Several candidates, graded in parallel."""

    model_config = WIRE_CONFIG

    requests: list[GradeRequest] = Field(min_length=1)


class CaseResult(BaseModel):
    """What became of one case."""

    status: CaseStatus
    wall_time: float = 0.0
    stdout: str = ""
    stderr: str = ""
    message: str = ""


class GradeResult(BaseModel):
    """The reward of one candidate: passed / total, or null when the service failed to grade."""

    id: str
    status: GradeStatus
    reward: float | None = None
    passed: int = 0
    total: int = 0
    compile: CompileResult | None = None
    cases: list[CaseResult] = Field(default_factory=list)
    audit: dict[str, int] = Field(default_factory=dict)


class GradeBatchResponse(BaseModel):
    """Results in the order of the requests."""

    results: list[GradeResult]
