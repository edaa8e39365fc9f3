"""The pure mappings of the drop-in wire formats (code-judge, SandboxFusion), row by row."""

from __future__ import annotations

import base64
import subprocess
import sys
import uuid

import pytest
from pydantic import ValidationError

from sandbox_service.api.compat.codejudge import (
    MAX_OUTPUT_CHARS,
    TIMEOUT_MARK,
    JudgeResult,
    Planned,
    Submission,
    SubmissionResult,
    plan,
    sub_id_of,
    to_submission_result,
)
from sandbox_service.api.compat.sandboxfusion import (
    InvalidRequest,
    RunCodeRequest,
    RunCodeResponse,
    Unsupported,
    to_execute_request,
    to_run_code_response,
)
from sandbox_service.settings import Settings
from trainer_client.wire import ExecuteRequest, ExecuteResult

SETTINGS = Settings(
    max_code_bytes=100, max_timeout=20, max_memory_mb=2048, codejudge_timeout_s=4,
    codejudge_memory_mb=384,
)  # fmt: skip


def result(status: str, **fields: object) -> ExecuteResult:
    return ExecuteResult.model_validate({"id": "job-1", "status": status, **fields})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_compat_mappings_import_no_io_library() -> None:
    probe = (
        "import sys, sandbox_service.api.compat.codejudge, "
        "sandbox_service.api.compat.sandboxfusion; "
        "print(sorted(m for m in ('fastapi', 'rq', 'redis', 'httpx', 'uvicorn') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- code-judge ---


def planned(**submission: object) -> Planned:
    body = {"type": "python", "solution": "print(1)", **submission}
    outcome = plan(Submission.model_validate(body), SETTINGS)
    assert isinstance(outcome, Planned), outcome
    return outcome


def test_a_python_submission_runs_with_the_code_judge_limits() -> None:
    p = planned(sub_id="s1", solution="print(input())", input="9", expected_output="9")
    assert p.sub_id == "s1" and p.expected_output == "9"
    assert p.request == ExecuteRequest(code="print(input())", stdin="9", timeout=4, memory_mb=384)
    assert planned(input=None).request.stdin == ""


def test_code_judge_limits_are_capped_by_the_server_limits() -> None:
    settings = Settings(max_timeout=2, max_memory_mb=256, codejudge_timeout_s=10)
    outcome = plan(Submission(type="python", solution="1"), settings)
    assert isinstance(outcome, Planned)
    assert (outcome.request.timeout, outcome.request.memory_mb) == (2, 256)


@pytest.mark.parametrize("given", [None, ""])
def test_a_missing_sub_id_becomes_a_uuid(given: str | None) -> None:
    assert uuid.UUID(sub_id_of(given)).version == 4
    assert sub_id_of("mine") == "mine"


def test_cpp_runs_as_a_cpp_request_with_code_judges_limits() -> None:
    outcome = plan(
        Submission.model_validate({"type": "cpp", "solution": "int main(){}", "sub_id": "c"}),
        SETTINGS,
    )
    assert isinstance(outcome, Planned)
    assert (outcome.request.language, outcome.request.code) == ("cpp", "int main(){}")
    assert (outcome.request.timeout, outcome.request.memory_mb) == (4, 384)


def test_a_compile_error_is_a_failed_run_with_the_compilers_messages_and_no_reason() -> None:
    planned = Planned("c", ExecuteRequest(code="x", language="cpp", timeout=4), None)
    compiled = {
        "status": "error",
        "exit_code": 1,
        "stderr": "main.cpp:1: error: x",
        "wall_time": 0.8,
    }
    failed = result("error", exit_code=1, stderr="main.cpp:1: error: x", compile=compiled)
    assert to_submission_result(planned, failed) == SubmissionResult(
        sub_id="c", success=False, run_success=False, cost=0.0, stdout="",
        stderr="main.cpp:1: error: x", reason="",
    )  # fmt: skip


def test_math_is_an_internal_error_with_no_output_as_code_judge_answers_it() -> None:
    outcome = plan(Submission.model_validate({"type": "math", "solution": "x"}), SETTINGS)
    assert isinstance(outcome, SubmissionResult)
    assert outcome.model_dump(exclude={"sub_id"}) == {
        "success": False, "run_success": False, "cost": 0.0, "stdout": None, "stderr": None,
        "reason": "internal_error",
    }  # fmt: skip


def test_a_solution_over_the_size_limit_is_invalid_input_naming_the_field() -> None:
    outcome = plan(Submission(type="python", solution="#" * 101), SETTINGS)
    assert isinstance(outcome, SubmissionResult) and outcome.reason == "invalid_input"
    assert outcome.stderr is not None and outcome.stderr.startswith("solution: ")


def test_submission_schema_is_code_judges() -> None:
    with pytest.raises(ValidationError) as info:
        Submission.model_validate({"type": "ruby", "solution": "x"})
    assert info.value.errors()[0]["loc"] == ("type",)
    with pytest.raises(ValidationError):
        Submission.model_validate({"type": "python"})
    # unknown fields are ignored, as by code-judge's pydantic models
    assert (
        Submission.model_validate({"type": "python", "solution": "1", "extra": 1}).solution == "1"
    )


@pytest.mark.parametrize(
    ("status", "fields", "run_success", "reason", "has_output"),
    [
        ("ok", {"exit_code": 0}, True, "", True),
        ("error", {"exit_code": 1}, False, "", True),
        ("memory_limit", {"exit_code": 1}, False, "", True),
        ("killed", {"signal": 9}, False, "", True),
        ("timeout", {"signal": 9}, False, "worker_timeout", True),
        ("queue_timeout", {"queue_time": 61.5}, False, "queue_timeout", False),
        ("sandbox_error", {}, False, "internal_error", False),
    ],
)
def test_submission_result_per_status(
    status: str, fields: dict[str, object], run_success: bool, reason: str, has_output: bool
) -> None:
    execution = result(status, stdout="out\n", stderr="err", wall_time=0.25, **fields)
    mapped = to_submission_result(planned(sub_id="s"), execution)
    assert (mapped.sub_id, mapped.run_success, mapped.reason) == ("s", run_success, reason)
    assert mapped.success is run_success
    mark = TIMEOUT_MARK if reason == "worker_timeout" else ""
    if has_output:
        assert (mapped.stdout, mapped.stderr, mapped.cost) == ("out\n" + mark, "err", 0.25)
    else:
        assert mapped.stdout is None and mapped.stderr is None
    if status == "queue_timeout":
        assert mapped.cost == 61.5


@pytest.mark.parametrize("status", ["ok", "error", "killed"])
def test_a_run_that_lasted_the_whole_limit_is_a_worker_timeout(status: str) -> None:
    # code-judge's alarm fires at MAX_EXECUTION_TIME: nothing ends later than that on its own.
    execution = result(status, stdout="partial\n", exit_code=0, wall_time=4.0)
    mapped = to_submission_result(planned(expected_output="partial"), execution)
    assert (mapped.run_success, mapped.success, mapped.reason) == (False, False, "worker_timeout")
    assert mapped.stdout == "partial\nSuicide from timeout.\n"


def test_judge_result_is_the_submission_result_without_output() -> None:
    mapped = to_submission_result(planned(sub_id="j"), result("ok", stdout="1\n", wall_time=0.1))
    judged = JudgeResult.of(mapped)
    assert list(judged.model_dump()) == ["sub_id", "success", "run_success", "cost", "reason"]
    assert (judged.sub_id, judged.success, judged.run_success) == ("j", True, True)


@pytest.mark.parametrize(
    ("stdout", "expected", "success"),
    [
        ("9\n", "9", True),
        ("  9  \n\n", "\n9 ", True),
        ("9\n", "10", False),
        ("9 9\n", "9", False),
        ("", "", True),
        ("anything\n", None, True),
    ],
)
def test_success_compares_stripped_stdout(stdout: str, expected: str | None, success: bool) -> None:
    mapped = to_submission_result(
        planned(expected_output=expected), result("ok", exit_code=0, stdout=stdout)
    )
    assert (mapped.run_success, mapped.success) == (True, success)


def test_a_failed_run_is_never_a_success_even_with_the_expected_output() -> None:
    mapped = to_submission_result(planned(expected_output="9"), result("error", stdout="9\n"))
    assert (mapped.run_success, mapped.success) == (False, False)


def test_output_is_cut_to_code_judges_length_after_the_comparison() -> None:
    long = "x" * 3000
    mapped = to_submission_result(
        planned(expected_output=long), result("ok", exit_code=0, stdout=long, stderr="e" * 1500)
    )
    assert mapped.success is True
    assert mapped.stdout == "x" * MAX_OUTPUT_CHARS and mapped.stderr == "e" * MAX_OUTPUT_CHARS


# --- SandboxFusion ---


def sf_request(**body: object) -> RunCodeRequest:
    return RunCodeRequest.model_validate({"code": "print(1)", "language": "python", **body})


def test_verls_payload_becomes_our_request() -> None:
    verl = sf_request(
        compile_timeout=10, run_timeout=10, code="print(input())", stdin="5",
        memory_limit_MB=1024, files={}, fetch_files=[],
    )  # fmt: skip
    assert to_execute_request(verl, SETTINGS) == ExecuteRequest(
        code="print(input())", stdin="5", timeout=10, memory_mb=1024
    )


@pytest.mark.parametrize(
    ("memory_limit", "memory_mb"),
    [(-1, 2048), (0, 2048), (8, 16), (512, 512), (10**6, 2048)],
)
def test_memory_limit_defaults_to_the_server_maximum_and_is_clamped(
    memory_limit: int, memory_mb: int
) -> None:
    request = to_execute_request(sf_request(memory_limit_MB=memory_limit), SETTINGS)
    assert request.memory_mb == memory_mb


def test_defaults_and_caps() -> None:
    request = to_execute_request(sf_request(), SETTINGS)
    assert (request.timeout, request.memory_mb, request.stdin) == (10, 2048, "")
    assert to_execute_request(sf_request(run_timeout=999), SETTINGS).timeout == 20
    assert to_execute_request(sf_request(run_timeout=0.5), SETTINGS).timeout == 0.5


def test_null_and_ignored_files_are_not_written() -> None:
    files = {"a.txt": b64(b"a"), "b.txt": None, "x/IGNORE_THIS_FILE.txt": b64(b"c")}
    request = to_execute_request(sf_request(files=files, fetch_files=["out"]), SETTINGS)
    assert request.files == {"a.txt": b64(b"a")} and request.fetch_files == ["out"]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"run_timeout": 0}, ["body", "run_timeout"]),
        ({"files": {"/etc/passwd": b64(b"x")}}, ["body", "files"]),
        ({"files": {"../up": b64(b"x")}}, ["body", "files"]),
        ({"files": {"a": "not base64!"}}, ["body", "files"]),
        ({"fetch_files": ["/etc/passwd"]}, ["body", "fetch_files"]),
        ({"code": "#" * 101}, ["body", "code"]),
    ],
)
def test_invalid_bodies_name_sandboxfusions_field(body: dict[str, object], loc: list[str]) -> None:
    with pytest.raises(InvalidRequest) as info:
        to_execute_request(sf_request(**body), SETTINGS)
    assert loc in [list(problem["loc"]) for problem in info.value.problems]


def test_other_sandboxfusion_languages_are_unsupported_unknown_ones_invalid() -> None:
    with pytest.raises(Unsupported, match="supported: python, cpp"):
        to_execute_request(sf_request(language="go"), SETTINGS)
    assert to_execute_request(sf_request(language="cpp"), SETTINGS).language == "cpp"
    with pytest.raises(ValidationError) as info:
        sf_request(language="klingon")
    assert info.value.errors()[0]["loc"] == ("language",)
    with pytest.raises(ValidationError):
        RunCodeRequest.model_validate({"code": "1"})  # language is required there
    assert sf_request(args=["-x"], unknown=1).args == ["-x"]


@pytest.mark.parametrize(
    ("execution", "status", "run_status", "return_code"),
    [
        (result("ok", exit_code=0), "Success", "Finished", 0),
        (result("error", exit_code=3), "Failed", "Finished", 3),
        (result("memory_limit", exit_code=1), "Failed", "Finished", 1),
        (result("memory_limit", signal=9), "Failed", "Finished", -9),
        (result("killed", signal=31), "Failed", "Finished", -31),
        (result("timeout", signal=9), "Failed", "TimeLimitExceeded", None),
    ],
)
def test_run_code_response_per_status(
    execution: ExecuteResult, status: str, run_status: str, return_code: int | None
) -> None:
    execution = execution.model_copy(
        update={"stdout": "o", "stderr": "e", "wall_time": 1.5, "files": {"f": "AA=="}}
    )
    response = to_run_code_response(execution)
    assert (response.status, response.message, response.compile_result) == (status, "", None)
    assert response.run_result is not None
    assert response.run_result.model_dump() == {
        "status": run_status, "execution_time": 1.5, "return_code": return_code,
        "stdout": "o", "stderr": "e",
    }  # fmt: skip
    assert response.files == {"f": "AA=="} and response.executor_pod_name is None


def test_a_cpp_compile_step_is_the_compile_result_and_a_failed_one_has_no_run() -> None:
    compiled = {"status": "ok", "exit_code": 0, "stderr": "", "wall_time": 0.9}
    ran = to_run_code_response(result("ok", exit_code=0, stdout="a", compile=compiled))
    assert ran.status == "Success" and ran.run_result is not None
    assert ran.compile_result is not None
    assert (ran.compile_result.status, ran.compile_result.return_code) == ("Finished", 0)
    assert ran.compile_result.execution_time == 0.9
    refused = {"status": "error", "exit_code": 1, "stderr": "main.cpp:1: error", "wall_time": 0.5}
    failed = to_run_code_response(result("error", exit_code=1, compile=refused))
    assert (failed.status, failed.run_result) == ("Failed", None)
    assert failed.compile_result is not None
    assert failed.compile_result.model_dump() == {
        "status": "Finished", "execution_time": 0.5, "return_code": 1, "stdout": "",
        "stderr": "main.cpp:1: error",
    }  # fmt: skip
    slow = {"status": "timeout", "wall_time": 10.0}
    timed_out = to_run_code_response(result("error", compile=slow))
    assert timed_out.status == "Failed" and timed_out.compile_result is not None
    assert timed_out.compile_result.status == "TimeLimitExceeded"


def test_service_failures_are_sandbox_errors() -> None:
    never_ran = to_run_code_response(
        result("queue_timeout", stderr="not started within the queue deadline")
    )
    assert never_ran.status == "SandboxError" and never_ran.run_result is None
    assert never_ran.message.startswith("queue_timeout: not started within the queue deadline")
    lost = to_run_code_response(result("sandbox_error", stderr="the worker was lost"))
    assert (lost.status, lost.message) == ("SandboxError", "the worker was lost")
    assert lost.run_result is not None and lost.run_result.status == "Error"
    assert lost.run_result.return_code is None


def test_response_has_sandboxfusions_fields_in_order() -> None:
    response = to_run_code_response(result("ok", exit_code=0))
    assert list(RunCodeResponse.model_validate(response.model_dump()).model_dump()) == [
        "status", "message", "compile_result", "run_result", "executor_pod_name", "files",
    ]  # fmt: skip
