"""Sealed grading (`POST /grade`): the orders of its runs and the verdict of each case (pure).

Every case is decided here, outside every jail, from an execution's result (a ResultDict, as
/execute answers) and the frames its program wrote (grade_reports.py):

    stdio     the candidate runs as a plain execution; passed when it exited 0 and its stdout,
              trailing whitespace of each line and trailing empty lines dropped, equals the
              expected stdout
    function  jail/grade_candidate.py loads the candidate, calls the entry point once and
              reports the value as tagged plain data (plain_data.py); passed when it equals
              `expected` by plain_data.equal
    asserts   jail/grade_evaluator.py runs the setup and one assert with the candidate's names
              as proxies, in runs of its own; each call it makes is served by a fresh run of the
              candidate's harness that replays the case's earlier calls first (api/grade.py
              drives the rounds); passed when the evaluator's own verdict says so

A run that ends without its reply fails the case by how it ended: `timeout` and `memory_limit`
as the execution says, `early_exit` when the candidate ended its own run (an exit of any kind, a
skip, a signal it sent itself, exec), `killed` for the jail's own kill (a forbidden system call).
An infrastructure status of any run is the whole request's status, with no reward.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandbox_service import grade_reports, plain_data
from sandbox_service.grade_reports import RunReport
from sandbox_service.jobs import ResultDict

INFRASTRUCTURE_STATUSES = ("queue_timeout", "sandbox_error", "cancelled", "deadline_exceeded")
OUTPUT_CHARS = 4096
"""A case's stdout and stderr in the answer are cut to their last this many characters."""
MAX_CROSSINGS = 256
"""Most calls into the candidate one `asserts` case may make (each costs two runs)."""
RUN_OUTPUT_BYTES = 8 * 1024 * 1024
"""The output cap of a grading run: room for a large reported value after the program's own."""
SELF_SIGNALS = frozenset(
    int(s)
    for s in (
        signal.SIGKILL,
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
        signal.SIGABRT,
        signal.SIGSTOP,
    )
)
"""Signals that only a kill (the program's own, the jail's are statuses) ends a run with."""


@dataclass(frozen=True, slots=True)
class CaseVerdict:
    """What became of one case."""

    status: str
    wall_time: float = 0.0
    stdout: str = ""
    stderr: str = ""
    message: str = ""


def infrastructure_status(result: ResultDict) -> str | None:
    """The run's infrastructure status, if the service (not the program) ended it."""
    status = str(result.get("status", "sandbox_error"))
    return status if status in INFRASTRUCTURE_STATUSES else None


def normalized_lines(text: str) -> list[str]:
    """Stdout as the stdio comparison sees it."""
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def stdio_verdict(result: ResultDict, expected_stdout: str) -> CaseVerdict:
    """The verdict of a stdio case from its plain execution."""
    status = str(result.get("status"))
    stdout = str(result.get("stdout", ""))
    common = _outputs(result, stdout)
    if status == "ok":
        if result.get("stdout_truncated"):
            return CaseVerdict(
                "failed", message="stdout was longer than the grader reads", **common
            )
        if normalized_lines(stdout) == normalized_lines(expected_stdout):
            return CaseVerdict("passed", **common)
        return CaseVerdict("failed", message="stdout differs from the expected", **common)
    if status in ("timeout", "memory_limit", "killed", "error"):
        return CaseVerdict(status, message=_exit_text(result), **common)
    return CaseVerdict("error", message=f"run status {status}", **common)


def candidate_orders(
    nonce: str,
    code: str,
    calls: Sequence[dict[str, Any]],
    names: bool = False,
    only: Sequence[str] | None = None,
) -> str:
    """The stdin of a run of jail/grade_candidate.py."""
    orders = {
        "n": nonce,
        "code": code,
        "names": names,
        "only": None if only is None else list(only),
        "calls": list(calls),
    }
    return json.dumps(orders)


def evaluator_orders(
    nonce: str, setup: str, assertion: str, names: list[Any], transcript: list[Any]
) -> str:
    """The stdin of a run of jail/grade_evaluator.py."""
    orders = {
        "n": nonce,
        "setup": setup,
        "assert": assertion,
        "names": names,
        "transcript": transcript,
        "max_calls": MAX_CROSSINGS,
    }
    return json.dumps(orders)


def tag_json(value: Any) -> Any:
    """Tagged plain data of a JSON value (a test's arguments)."""
    if value is None:
        return ["N"]
    if isinstance(value, bool):
        return ["B", value]
    if isinstance(value, int):
        return ["I", format(value, "x")]
    if isinstance(value, float):
        return ["F", value.hex()]
    if isinstance(value, str):
        return ["S", value]
    if isinstance(value, list):
        return ["L", [tag_json(item) for item in value]]
    if isinstance(value, dict):
        return ["D", [[tag_json(k), tag_json(v)] for k, v in value.items()]]
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def function_call(entry_point: str, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call request of a function case."""
    return {
        "t": ["entry", entry_point],
        "a": [tag_json(a) for a in args],
        "k": {k: tag_json(v) for k, v in kwargs.items()},
    }


def read_run(result: ResultDict, nonce: str) -> RunReport:
    """The frames of a grading run, with what its end adds to the audit."""
    report = grade_reports.read(str(result.get("stdout", "")), nonce)
    status = str(result.get("status"))
    finished = report.done or report.need is not None or report.verdict is not None
    if report.exit is not None or (not finished and status in ("ok", "error")):
        report.at_least("early_exits", 1)
    if status in ("timeout", "memory_limit"):
        report.at_least("limits_reached", 1)
    if not finished and status == "killed" and _signal(result) in SELF_SIGNALS:
        report.at_least("early_exits", 1)
        report.at_least("signals_sent", 1)
    return report


def stdio_report(result: ResultDict) -> RunReport:
    """The audit of a plain (stdio) run: what can be seen from outside it."""
    report = RunReport()
    if str(result.get("status")) in ("timeout", "memory_limit"):
        report.at_least("limits_reached", 1)
    forged = str(result.get("stdout", "")).count(grade_reports.MARK_WORD)
    if forged:
        report.count("forged_output", forged)
    return report


def function_verdict(result: ResultDict, report: RunReport, expected: Any) -> CaseVerdict:
    """The verdict of a function case from its harness run."""
    reply = report.results.get(0)
    if reply is None:
        return ended_without_reply(result, report)
    common = _outputs(result, report.stdout)
    answer = reply[0]
    if not answer or answer[0] != "ok" or len(answer) != 2:
        raised = f"{answer[1]}: {answer[2]}" if len(answer) == 3 else "no value"
        return CaseVerdict("error", message=f"the call raised {raised}"[:300], **common)
    try:
        value = plain_data.decode(answer[1])
    except plain_data.Malformed as exc:
        report.count("forged_output")
        return CaseVerdict("failed", message=f"unreadable report: {exc}", **common)
    if report.audit.get("forged_output"):
        return CaseVerdict("failed", message="output imitating the grader's reports", **common)
    if plain_data.equal(value, expected):
        return CaseVerdict("passed", **common)
    return CaseVerdict("failed", message=f"returned {_shown(value)}", **common)


def ended_without_reply(result: ResultDict, report: RunReport) -> CaseVerdict:
    """The verdict of a candidate's run that ended before it answered what it was asked."""
    status = str(result.get("status"))
    common = _outputs(result, report.stdout)
    if status in ("timeout", "memory_limit"):
        return CaseVerdict(status, message=_exit_text(result), **common)
    if report.load_error is not None:
        name, message = report.load_error
        return CaseVerdict("error", message=f"loading raised {name}: {message}", **common)
    if report.exit is not None:
        why = f"the candidate ended its run ({report.exit[1]})"
        return CaseVerdict("early_exit", message=why, **common)
    if status == "killed" and _signal(result) not in SELF_SIGNALS:
        return CaseVerdict("killed", message=_exit_text(result), **common)
    return CaseVerdict("early_exit", message=f"no reply: {_exit_text(result)}", **common)


def evaluator_verdict(result: ResultDict, report: RunReport) -> CaseVerdict | None:
    """The verdict of an evaluator run, or None when it needs a call served first."""
    if report.need is not None and report.verdict is None:
        return None
    status = str(result.get("status"))
    if report.verdict is None:
        if status in ("timeout", "memory_limit"):
            return CaseVerdict(status, message="the tests' evaluator: " + _exit_text(result))
        return CaseVerdict("error", message="the tests' evaluator: " + _exit_text(result))
    verdict, message = report.verdict
    if verdict in ("passed", "failed", "error"):
        return CaseVerdict(verdict, message=message)
    return CaseVerdict("error", message=f"the candidate's replies changed on replay: {message}")


def valid_names(names: Any) -> list[Any] | None:
    """The names a candidate reported, if well-formed (each value readable plain data)."""
    if not isinstance(names, list):
        return None
    for item in names:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
            return None
        if not item[0].isidentifier() or len(item[0]) > 100:
            return None
        if item[1] != ["Q"]:
            try:
                plain_data.decode(item[1])
            except plain_data.Malformed:
                return None
    return names


def with_outputs(verdict: CaseVerdict, result: ResultDict, report: RunReport) -> CaseVerdict:
    """The verdict with the candidate run's time and outputs."""
    common = _outputs(result, report.stdout)
    return CaseVerdict(verdict.status, message=verdict.message, **common)


def merged_audit(reports: Sequence[RunReport], loading: RunReport | None = None) -> dict[str, int]:
    """A request's audit: every key of the spec, each the sum over its cases (at least what
    the candidate's loading alone did, when it was run once on its own)."""
    audit = dict.fromkeys(grade_reports.AUDIT_KEYS, 0)
    for report in reports:
        for key, value in report.audit.items():
            audit[key] = audit.get(key, 0) + value
    for key, value in (loading.audit if loading is not None else {}).items():
        audit[key] = max(audit.get(key, 0), value)
    return audit


def _outputs(result: ResultDict, stdout: str) -> dict[str, Any]:
    return {
        "wall_time": float(result.get("wall_time", 0.0) or 0.0),
        "stdout": stdout[-OUTPUT_CHARS:],
        "stderr": str(result.get("stderr", ""))[-OUTPUT_CHARS:],
    }


def _signal(result: ResultDict) -> int | None:
    value = result.get("signal")
    return value if isinstance(value, int) else None


def _exit_text(result: ResultDict) -> str:
    status = result.get("status")
    if _signal(result) is not None:
        return f"{status}, signal {_signal(result)}"
    return f"{status}, exit code {result.get('exit_code')}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."
