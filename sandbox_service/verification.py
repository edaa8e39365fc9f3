"""Answer verification (`POST /verify`) as ordinary jailed executions (pure).

A request's items are split into jobs of a few items; each job is one execution whose program is
jail/verify_program.py with the answer checker's source (rl/reward/math_equal.py), and whose
stdin holds the items. The worker runs it like any program, in the jail; the API reads the
verdict lines back from its stdout here, bounded and checked, since they are bytes a jailed
process wrote. Verdicts and their reasons:

    correct    equivalent             the answer denotes the reference's object
    incorrect  not_equivalent         it does not
    timeout    time_limit             the check overran the item's limit (killed)
    invalid    empty_answer           nothing to judge (not sent to a worker)
               too_long               answer or reference over MAX_ANSWER_CHARS (not sent)
               unparsable_answer      math-verify read nothing from the answer
               unparsable_reference   ... nor from the reference
               checker_error          the check raised (the detail says what)
               crashed                the check's process died (memory limit, signal)
               queue_timeout          not judged: the service did not start it in time
               sandbox_error          not judged: the service failed (detail); retry it
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandbox_service.jobs import ResultDict
from trainer_client.wire import (
    VERIFY_ITEM_SLACK_S,
    VERIFY_MAX_ITEMS_PER_JOB,
    VERIFY_STARTUP_S,
    VerdictName,
)

Verdict = VerdictName
VERDICTS: tuple[Verdict, ...] = ("correct", "incorrect", "timeout", "invalid")
REASONS = frozenset(
    {
        "equivalent",
        "not_equivalent",
        "time_limit",
        "empty_answer",
        "too_long",
        "unparsable_answer",
        "unparsable_reference",
        "checker_error",
        "crashed",
        "queue_timeout",
        "sandbox_error",
    }
)

MAX_ANSWER_CHARS = 4096
"""Longer answers or references are `invalid` unchecked: no real answer is this long, and
parsing one costs time that other items need."""
LINE_BUDGET_BYTES = 320
"""Stdout bytes reserved per item's verdict line (the driver bounds its detail to fit)."""
DETAIL_CHARS = 200


@dataclass(frozen=True, slots=True)
class VerifyItem:
    """One answer to judge against its reference."""

    answer: str
    reference: str


@dataclass(frozen=True, slots=True)
class ItemVerdict:
    """The judgement of one item."""

    verdict: Verdict
    reason: str
    detail: str = ""
    time_s: float = 0.0
    """Seconds the check took in its worker (0 for items never sent to one)."""


@dataclass(frozen=True, slots=True)
class VerifyPlan:
    """How a request is judged: items answered without a worker, and the jobs for the rest."""

    answered: dict[int, ItemVerdict]
    jobs: list[list[int]]
    """Item indices of each job."""


def items_per_job(item_timeout_s: float, max_timeout_s: float) -> int:
    """Most items one job may hold so that its program limit stays within max_timeout_s; 0 when
    even one does not fit. Its verdict lines get their own output cap (job_output_bytes)."""
    by_time = int((max_timeout_s - VERIFY_STARTUP_S) // (item_timeout_s + VERIFY_ITEM_SLACK_S))
    return max(0, min(by_time, VERIFY_MAX_ITEMS_PER_JOB))


def job_output_bytes(items: int) -> int:
    """The output cap of a job of `items` items: room for each verdict line, whatever the
    server's max_output_bytes for programs is."""
    return items * LINE_BUDGET_BYTES


def plan(items: Sequence[VerifyItem], per_job: int) -> VerifyPlan:
    """Answer what needs no checker; split the rest into jobs of at most per_job items,
    spread evenly (ten items and a bound of eight make two jobs of five)."""
    if per_job < 1:
        raise ValueError("per_job must be at least 1")
    answered: dict[int, ItemVerdict] = {}
    todo: list[int] = []
    for index, item in enumerate(items):
        if not item.answer.strip():
            answered[index] = ItemVerdict("invalid", "empty_answer")
        elif len(item.answer) > MAX_ANSWER_CHARS or len(item.reference) > MAX_ANSWER_CHARS:
            answered[index] = ItemVerdict("invalid", "too_long", f"over {MAX_ANSWER_CHARS} chars")
        else:
            todo.append(index)
    if not todo:
        return VerifyPlan(answered, [])
    count = -(-len(todo) // per_job)
    size = -(-len(todo) // count)
    return VerifyPlan(answered, [todo[i : i + size] for i in range(0, len(todo), size)])


def program(driver_source: str, checker_source: str) -> str:
    """The code of every verification job: the driver, then its call with the checker."""
    return f"{driver_source}\n\nmain({checker_source!r})\n"


def job_stdin(items: Sequence[VerifyItem], item_timeout_s: float, rel_tol: float) -> str:
    """The stdin of one job."""
    pairs = [[item.answer, item.reference] for item in items]
    return json.dumps({"items": pairs, "timeout_s": item_timeout_s, "rel_tol": rel_tol})


def read_verdicts(result: ResultDict, num_items: int) -> list[ItemVerdict]:
    """The verdicts of a job's num_items items from its execution result.

    Lines that are not well-formed verdicts are ignored (a jailed process wrote them); an item
    without one is answered from the execution's status: its limit (timeout), the service's
    failure (queue_timeout, sandbox_error), or the checker's (crashed).
    """
    found: dict[int, ItemVerdict] = {}
    stdout = result.get("stdout")
    for line in (stdout if isinstance(stdout, str) else "").splitlines():
        parsed = _verdict_line(line, num_items)
        if parsed is not None and parsed[0] not in found:
            found[parsed[0]] = parsed[1]
    status = str(result.get("status", "sandbox_error"))
    missing = _missing(status, str(result.get("stderr", "")))
    return [found.get(i, missing) for i in range(num_items)]


def _verdict_line(line: str, num_items: int) -> tuple[int, ItemVerdict] | None:
    if len(line) > 4 * LINE_BUDGET_BYTES:
        return None
    try:
        raw: Any = json.loads(line)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    index, verdict, reason = raw.get("i"), raw.get("v"), raw.get("r")
    elapsed, detail = raw.get("t", 0.0), raw.get("d", "")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < num_items:
        return None
    if verdict not in VERDICTS or reason not in REASONS or not isinstance(detail, str):
        return None
    if isinstance(elapsed, bool) or not isinstance(elapsed, int | float) or elapsed < 0:
        return None
    return index, ItemVerdict(verdict, reason, detail[:DETAIL_CHARS], float(elapsed))


def _missing(status: str, stderr: str) -> ItemVerdict:
    """The verdict of an item the job did not answer, by the execution's status."""
    if status == "timeout":
        return ItemVerdict("timeout", "time_limit", "the job reached its limit first")
    if status in ("queue_timeout", "sandbox_error"):
        return ItemVerdict("invalid", status, stderr[-DETAIL_CHARS:])
    if status == "memory_limit":
        return ItemVerdict("invalid", "crashed", "memory limit")
    return ItemVerdict("invalid", "crashed", f"no verdict ({status}): {stderr[-DETAIL_CHARS:]}")
