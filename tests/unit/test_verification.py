"""The pure side of POST /verify: planning jobs and reading verdict lines a jailed process wrote."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_service import verification as v
from sandbox_service.api.verify import CHECKER_MODULE, verify_code
from trainer_client.wire import VERIFY_MAX_ITEMS_PER_JOB, verify_job_timeout_s

ROOT = Path(__file__).resolve().parents[2]


def line(**fields: object) -> str:
    return json.dumps({"i": 0, "v": "correct", "r": "equivalent", "t": 0.1, "d": "", **fields})


def test_items_that_need_no_checker_are_answered_and_the_rest_spread_evenly() -> None:
    items = [v.VerifyItem("1", "1")] * 10 + [v.VerifyItem("  ", "1"), v.VerifyItem("x" * 5000, "1")]
    planned = v.plan(items, per_job=8)
    assert [len(job) for job in planned.jobs] == [5, 5]
    assert sorted(i for job in planned.jobs for i in job) == list(range(10))
    assert planned.answered[10].reason == "empty_answer"
    assert planned.answered[11].reason == "too_long"
    assert {x.verdict for x in planned.answered.values()} == {"invalid"}


def test_a_job_fits_the_servers_time_limit_and_its_lines_their_own_output_cap() -> None:
    per_job = v.items_per_job(5.0, 60.0)
    assert 1 <= per_job <= VERIFY_MAX_ITEMS_PER_JOB
    assert verify_job_timeout_s(per_job, 5.0) <= 60.0
    assert v.items_per_job(55.0, 60.0) == 0  # one item and the import do not fit
    # Each verdict line has its budget, whatever the server's max_output_bytes for programs.
    assert v.job_output_bytes(per_job) == per_job * v.LINE_BUDGET_BYTES


def test_only_well_formed_verdict_lines_count() -> None:
    stdout = "\n".join(
        [
            "garbage",
            line(i=5),  # out of range
            line(i=True),  # a bool is not an index
            line(i=1, v="correct!"),  # not a verdict
            line(i=1, r="because"),  # not a reason
            line(i=1, t=-1),
            line(i=1, v="incorrect", r="not_equivalent", d="x" * 1000),
            line(i=1, v="correct", r="equivalent"),  # a second line for 1: the first one wins
            "[1, 2]",
        ]
    )
    verdicts = v.read_verdicts({"status": "ok", "stdout": stdout}, 3)
    assert verdicts[1].verdict == "incorrect" and len(verdicts[1].detail) == v.DETAIL_CHARS
    assert [x.reason for x in (verdicts[0], verdicts[2])] == ["crashed", "crashed"]


@pytest.mark.parametrize(
    ("status", "verdict", "reason"),
    [
        ("timeout", "timeout", "time_limit"),
        ("queue_timeout", "invalid", "queue_timeout"),
        ("sandbox_error", "invalid", "sandbox_error"),
        ("memory_limit", "invalid", "crashed"),
        ("killed", "invalid", "crashed"),
    ],
)
def test_items_without_a_verdict_are_answered_by_the_executions_status(
    status: str, verdict: str, reason: str
) -> None:
    result = {"status": status, "stdout": line(i=0), "stderr": "why"}
    first, second = v.read_verdicts(result, 2)
    assert (first.verdict, first.reason) == ("correct", "equivalent")
    assert (second.verdict, second.reason) == (verdict, reason)


def _imports(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_jailed_program_needs_only_the_standard_library_sympy_and_math_verify() -> None:
    # It runs in the jail's interpreter, which has the service's libraries but none of its
    # packages (and no torch): the driver and the checker must stand alone.
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    checker = ROOT / (CHECKER_MODULE.replace(".", "/") + ".py")
    assert _imports(ROOT / "sandbox_service/jail/verify_program.py") <= stdlib
    assert _imports(checker) <= stdlib | {"sympy", "math_verify"}


def run_program(
    items: list[tuple[str, str]], timeout_s: float, soft: bool = True
) -> list[v.ItemVerdict]:
    """The program as the jail runs it, in a plain interpreter (tests/service has the jail)."""
    stdin = json.loads(v.job_stdin([v.VerifyItem(a, r) for a, r in items], timeout_s, 1e-6))
    out = subprocess.run(
        [sys.executable, "-I", "-c", verify_code()],
        input=json.dumps({**stdin, "soft": soft}),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return v.read_verdicts({"status": "ok", "stdout": out.stdout}, len(items))


def test_the_program_judges_each_item() -> None:
    verdicts = run_program(
        [("\\frac{1}{2}", "0.5"), ("3", "4"), ("2", "\\sqrt{4}"), ("1", "\\text{}")], 10.0
    )
    assert [(x.verdict, x.reason) for x in verdicts] == [
        ("correct", "equivalent"),
        ("incorrect", "not_equivalent"),
        ("correct", "equivalent"),
        ("invalid", "unparsable_reference"),
    ]


def test_a_check_stuck_in_c_is_killed_at_its_limit_and_the_next_item_still_judged() -> None:
    # No soft timer: only the SIGKILL can end 9^(9^(9^9)); the item after it gets its verdict.
    verdicts = run_program([("9^{9^{9^9}}", "1"), ("7", "7")], 2.0, soft=False)
    assert (verdicts[0].verdict, verdicts[0].reason) == ("timeout", "time_limit")
    assert "killed" in verdicts[0].detail
    assert (verdicts[1].verdict, verdicts[1].reason) == ("correct", "equivalent")
