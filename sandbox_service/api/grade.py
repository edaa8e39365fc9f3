"""`POST /grade` and `POST /grade/batch`: sealed grading over the API's execution path.

Every run of a grading is an ordinary execution, admitted, queued, charged to the caller's
tenant and run in a worker's jail like /execute's; this module only drives the rounds and
leaves each verdict to sandbox_service.grading (pure). The first round runs every stdio and
function case and each asserts request's names run together (admitted whole or refused with
429, as a batch); then asserts cases proceed in lockstep rounds: the evaluators of all open
cases, then one candidate run for each evaluator that asked for a call.
"""

from __future__ import annotations

import base64
import functools
import marshal
import secrets
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError

import sandbox_service
from sandbox_service import grading
from sandbox_service.api.execute_routes import ERRORS
from sandbox_service.api.validation import Problem, utf8_size
from sandbox_service.api.verify import RunPayloads
from sandbox_service.grade_reports import RunReport
from sandbox_service.grading import CaseVerdict
from sandbox_service.import_scan import Zygote, zygote_for
from sandbox_service.jobs import JobPayload, ResultDict
from sandbox_service.logs import request_id_var
from sandbox_service.settings import Settings
from sandbox_service.tenancy import scoped, tenant_var
from trainer_client.grade_wire import (
    AssertsTests,
    CaseResult,
    FunctionTests,
    GradeBatchRequest,
    GradeBatchResponse,
    GradeRequest,
    GradeResult,
    StdioTests,
)
from trainer_client.wire import CompileResult

PACKAGE_IN_JAIL = "rl_sandbox_inside"
"""The package name of jail/inside/ in the zygote (its __main__.py): a warm zygote preloads the
grading programs there (heap.py), and a run forked from it finds them in sys.modules."""


@functools.cache
def program(name: str, marshalled: bool = True) -> str:
    """The code of an in-jail grading program (jail/inside/grade_candidate or grade_evaluator).

    A warm zygote has preloaded it: the run calls that copy. Otherwise (a cold jail) the run
    loads its own: the code object marshalled here (compiling the source costs a run about
    10 ms), or the source when the jail's interpreter is not this process's (setting
    `jail_python`; marshal's format is one interpreter version's).
    """
    path = Path(sandbox_service.__file__).parent / "jail" / "inside" / f"{name}.py"
    source = path.read_text()
    if marshalled:
        code = base64.b64encode(marshal.dumps(compile(source, path.name, "exec")))
        load = f"exec(marshal.loads(base64.b64decode({code!r})), _program.__dict__)"
    else:
        load = f"exec(compile({source!r}, {path.name!r}, 'exec'), _program.__dict__)"
    return (
        "import sys\n"
        f"_program = sys.modules.get({PACKAGE_IN_JAIL + '.' + name!r})\n"
        "if _program is None:\n"
        "    import base64, marshal, types\n"
        f"    _program = types.ModuleType({name!r})\n"
        f"    {load}\n"
        "_program.main()\n"
    )


ZYGOTE_HINTS: dict[Zygote, str] = {
    "math": "if False:\n    import numpy\n",
    "data": "if False:\n    import pandas\n",
}
"""Put before a grading program whose candidate imports beyond the standard library: the worker
picks a run's zygote from the program's imports (import_scan.py), and the candidate travels as
the program's data, so the harness names one import of the candidate's zygote for it."""


def _program(name: str, settings: Settings) -> str:
    return program(name, settings.jail_python in (None, "", sys.executable))


@dataclass(slots=True)
class Grading:
    """One request's grading in progress."""

    request: GradeRequest
    deadline: float
    verdicts: list[CaseVerdict | None]
    reports: list[RunReport]
    infrastructure: str | None = None
    compile: dict[str, Any] | None = None
    names: list[Any] | None = None
    transcripts: list[list[Any]] = field(default_factory=list)
    names_report: RunReport | None = None
    """An asserts request's names run (the candidate loaded once, no call made)."""
    last_runs: dict[int, tuple[ResultDict, RunReport]] = field(default_factory=dict)
    """An asserts case's latest candidate run: its outputs are the case's."""

    def fail(self, status: str) -> None:
        if self.infrastructure is None:
            self.infrastructure = status


@dataclass(frozen=True, slots=True)
class Run:
    """One execution of a round and what to do with its result."""

    grading: Grading
    case: int
    nonce: str
    payload: JobPayload
    expected: Any = None
    role: str = "case"
    """case (stdio, function), names, evaluator or candidate."""
    need: Any = None


def grade_router(settings: Settings, run: RunPayloads) -> APIRouter:
    """The /grade routes over the API's execution path."""
    router = APIRouter()
    responses: dict[int | str, dict[str, Any]] = {
        code: ERRORS[code] for code in (413, 422, 429, 503)
    }

    @router.post("/grade", response_model=GradeResult, responses=responses)
    async def grade(request: GradeRequest) -> GradeResult:
        """Grade one candidate: reward = passed / total, decided outside every jail."""
        _refuse(check(request, settings, ("body",)))
        (result,) = await grade_all([request], settings, run)
        return result

    @router.post("/grade/batch", response_model=GradeBatchResponse, responses=responses)
    async def grade_batch(batch: GradeBatchRequest) -> GradeBatchResponse:
        """Grade several candidates in parallel; results in the order of the requests."""
        problems = []
        if len(batch.requests) > settings.max_batch:
            problems.append(_problem(("body", "requests"), f"at most {settings.max_batch}"))
        for index, request in enumerate(batch.requests):
            problems.extend(check(request, settings, ("body", "requests", index)))
        _refuse(problems)
        return GradeBatchResponse(results=await grade_all(batch.requests, settings, run))

    return router


def _refuse(problems: list[Problem]) -> None:
    if problems:
        raise RequestValidationError(problems)


def _problem(loc: tuple[Any, ...], message: str) -> Problem:
    return {"type": "value_error", "loc": list(loc), "msg": message, "input": None}


def check(request: GradeRequest, settings: Settings, loc: tuple[Any, ...]) -> list[Problem]:
    """Problems of one request against the server's limits."""
    problems: list[Problem] = []
    tests = request.tests
    if request.language == "cpp" and not isinstance(tests, StdioTests):
        problems.append(_problem((*loc, "tests", "kind"), "language cpp grades stdio tests only"))
    if utf8_size(request.code) > settings.max_code_bytes:
        problems.append(_problem((*loc, "code"), f"code over {settings.max_code_bytes} bytes"))
    if request.timeout > settings.max_timeout:
        problems.append(_problem((*loc, "timeout"), f"timeout must be <= {settings.max_timeout}"))
    if request.memory_mb > settings.max_memory_mb:
        message = f"memory_mb must be <= {settings.max_memory_mb}"
        problems.append(_problem((*loc, "memory_mb"), message))
    cases = len(tests.asserts if isinstance(tests, AssertsTests) else tests.cases)
    if cases > settings.max_grade_cases:
        where = "asserts" if isinstance(tests, AssertsTests) else "cases"
        message = f"{cases} cases; at most {settings.max_grade_cases}"
        problems.append(_problem((*loc, "tests", where), message))
    if isinstance(tests, StdioTests):
        for index, case in enumerate(tests.cases):
            if utf8_size(case.stdin) > settings.max_stdin_bytes:
                message = f"stdin over {settings.max_stdin_bytes} bytes"
                problems.append(_problem((*loc, "tests", "cases", index, "stdin"), message))
    return problems


async def grade_all(
    requests: list[GradeRequest], settings: Settings, run: RunPayloads
) -> list[GradeResult]:
    """Grade the requests: the first round together, then the asserts rounds."""
    gradings = [_start(request) for request in requests]
    first = [r for g in gradings for r in _first_runs(g, settings)]
    await _round(first, run)
    while True:
        evaluators = [
            _evaluator_run(g, case, settings)
            for g in gradings
            if isinstance(g.request.tests, AssertsTests) and g.infrastructure is None
            for case, verdict in enumerate(g.verdicts)
            if verdict is None
        ]
        if not evaluators:
            break
        needs = await _round(evaluators, run)
        if needs:
            await _round([_candidate_run(r, settings) for r in needs], run)
    return [_answer(g) for g in gradings]


def _start(request: GradeRequest) -> Grading:
    tests = request.tests
    count = len(tests.asserts if isinstance(tests, AssertsTests) else tests.cases)
    deadline = 0.0 if request.deadline_s is None else time.time() + request.deadline_s
    return Grading(
        request=request,
        deadline=deadline,
        verdicts=[None] * count,
        reports=[RunReport() for _ in range(count)],
        transcripts=[[] for _ in range(count)],
    )


def _payload(
    g: Grading, code: str, stdin: str, settings: Settings, language: str = "python"
) -> JobPayload:
    request = g.request
    tenant = tenant_var.get()
    if language == "python" and code is not request.code:
        code = ZYGOTE_HINTS.get(zygote_for(request.code), "") + code
    return JobPayload(
        code=code,
        stdin=stdin,
        timeout_s=request.timeout,
        memory_mb=request.memory_mb,
        request_id=request_id_var.get(),
        seed=0 if request.seed is None else request.seed,
        output_bytes=max(settings.max_output_bytes, grading.RUN_OUTPUT_BYTES),
        group=None if request.group is None else scoped(tenant, request.group),
        deadline=g.deadline,
        language=language,
        tenant=tenant.name,
    )


def _first_runs(g: Grading, settings: Settings) -> list[Run]:
    tests = g.request.tests
    if isinstance(tests, StdioTests):
        return [
            Run(
                g,
                i,
                "",
                _payload(g, g.request.code, case.stdin, settings, g.request.language),
                expected=case.expected_stdout,
            )
            for i, case in enumerate(tests.cases)
        ]
    if isinstance(tests, FunctionTests):
        runs = []
        for i, case in enumerate(tests.cases):
            nonce = secrets.token_hex(8)
            call = grading.function_call(tests.entry_point, case.args, case.kwargs)
            orders = grading.candidate_orders(nonce, g.request.code, [call])
            payload = _payload(g, _program("grade_candidate", settings), orders, settings)
            runs.append(Run(g, i, nonce, payload, expected=case.expected))
        return runs
    nonce = secrets.token_hex(8)
    orders = grading.candidate_orders(nonce, g.request.code, [], True, tests.entry_points)
    return [
        Run(
            g,
            -1,
            nonce,
            _payload(g, _program("grade_candidate", settings), orders, settings),
            role="names",
        )
    ]


def _evaluator_run(g: Grading, case: int, settings: Settings) -> Run:
    tests = g.request.tests
    assert isinstance(tests, AssertsTests)
    nonce = secrets.token_hex(8)
    orders = grading.evaluator_orders(
        nonce, tests.setup, tests.asserts[case], g.names or [], g.transcripts[case]
    )
    return Run(
        g,
        case,
        nonce,
        _payload(g, _program("grade_evaluator", settings), orders, settings),
        role="evaluator",
    )


def _candidate_run(evaluated: Run, settings: Settings) -> Run:
    g, case = evaluated.grading, evaluated.case
    tests = g.request.tests
    assert isinstance(tests, AssertsTests)
    nonce = secrets.token_hex(8)
    calls = [entry[0] for entry in g.transcripts[case]] + [evaluated.need]
    orders = grading.candidate_orders(nonce, g.request.code, calls, True, tests.entry_points)
    payload = _payload(g, _program("grade_candidate", settings), orders, settings)
    return Run(g, case, nonce, payload, role="candidate", need=evaluated.need)


async def _round(runs: list[Run], run: RunPayloads) -> list[Run]:
    """Run one round; record what it decided; the evaluator runs that asked for a call."""
    if not runs:
        return []
    results = await run([r.payload for r in runs], "/grade")
    needs = []
    for item, result in zip(runs, results, strict=True):
        g = item.grading
        status = grading.infrastructure_status(result)
        if status is not None:
            g.fail(status)
            continue
        if item.role == "case":
            _decide_case(item, result)
        elif item.role == "names":
            _read_names(item, result)
        elif item.role == "evaluator":
            report = grading.read_run(result, item.nonce)
            verdict = grading.evaluator_verdict(result, report)
            if verdict is not None:
                last = g.last_runs.get(item.case)
                if last is not None:
                    verdict = grading.with_outputs(verdict, *last)
                g.verdicts[item.case] = verdict
            elif report.need is not None:
                needs.append(
                    Run(g, item.case, item.nonce, item.payload, role="evaluator", need=report.need)
                )
        else:
            _read_candidate(item, result)
    return needs


def _decide_case(item: Run, result: ResultDict) -> None:
    g = item.grading
    tests = g.request.tests
    if isinstance(tests, StdioTests):
        if g.compile is None and isinstance(result.get("compile"), dict):
            g.compile = result["compile"]
        g.verdicts[item.case] = grading.stdio_verdict(result, str(item.expected))
        g.reports[item.case] = grading.stdio_report(result)
        return
    report = grading.read_run(result, item.nonce)
    g.reports[item.case] = report
    g.verdicts[item.case] = grading.function_verdict(result, report, item.expected)


def _read_names(item: Run, result: ResultDict) -> None:
    g = item.grading
    report = grading.read_run(result, item.nonce)
    names = grading.valid_names(report.names) if report.done else None
    if names is None:
        verdict = grading.ended_without_reply(result, report)
        if verdict.status == "early_exit" and report.done:
            verdict = CaseVerdict("failed", message="the candidate's names are unreadable")
        g.verdicts = [verdict] * len(g.verdicts)
        g.reports = [report] + [RunReport() for _ in g.verdicts[1:]]
        return
    g.names = names
    g.names_report = report


def _read_candidate(item: Run, result: ResultDict) -> None:
    g, case = item.grading, item.case
    report = grading.read_run(result, item.nonce)
    g.reports[case] = report
    transcript = g.transcripts[case]
    calls = [entry[0] for entry in transcript] + [item.need]
    replies = [report.results.get(k) for k in range(len(calls))]
    if report.audit.get("forged_output"):
        verdict = CaseVerdict("failed", message="output imitating the grader's reports")
        g.verdicts[case] = grading.with_outputs(verdict, result, report)
    elif all(reply is not None for reply in replies):
        g.transcripts[case] = [
            [call, reply[0], reply[1]]
            for call, reply in zip(calls, replies, strict=True)
            if reply is not None
        ]
    else:
        g.verdicts[case] = grading.ended_without_reply(result, report)
    g.last_runs[case] = (result, report)


def _answer(g: Grading) -> GradeResult:
    compile_result = None if g.compile is None else CompileResult.model_validate(g.compile)
    if g.infrastructure is not None:
        return GradeResult(
            id=uuid.uuid4().hex,
            status=g.infrastructure,
            reward=None,
            total=len(g.verdicts),
            compile=compile_result,
        )
    verdicts = [v or CaseVerdict("error", message="not decided") for v in g.verdicts]
    passed = sum(1 for v in verdicts if v.status == "passed")
    return GradeResult(
        id=uuid.uuid4().hex,
        status="graded",
        reward=passed / len(verdicts),
        passed=passed,
        total=len(verdicts),
        compile=compile_result,
        cases=[
            CaseResult(
                status=v.status,
                wall_time=v.wall_time,
                stdout=v.stdout,
                stderr=v.stderr,
                message=v.message,
            )
            for v in verdicts
        ],
        audit=grading.merged_audit(g.reports, g.names_report),
    )
