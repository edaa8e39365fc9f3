"""p_err and p_format (paper Eq. 4-5) and the release's text variants, on rendered trajectories.

Expected values are the spec's table (shared/peers/rstar2-spec.md §3.4), worked out from the
paper's formulas and the release's regexes, not from this code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import rl_transcripts as tx

from rl.diagnostics import positive_tool_error_ratio
from rl.penalties import (
    FAILED_STATUSES,
    is_failed,
    is_infrastructure_failure,
    p_err,
    p_err_release,
    p_format,
    p_format_release,
    total_penalty,
)
from trainer_client.wire import ExecuteResult


def result(status: str) -> ExecuteResult:
    """A tool result as the service returns it."""
    return ExecuteResult(id="e1", status=status)


OK, ERR, TIMEOUT = result("ok"), result("error"), result("timeout")
PARSE = {"status": "parse_error"}  # recorded by the rollout loop; never reached the service

# name, response, structured results, assistant turns,
# (release p_err, p_fmt, total), (paper p_err, p_fmt, total)
TABLE: list[tuple[str, str, list[Any], int, tuple[float, ...], tuple[float, ...]]] = [
    ("T1 no tool call", tx.T1_NO_TOOL, [], 1, (0.5, 1.0, 1.5), (0.5, 0.0, 0.5)),
    ("T2 one ok call", tx.T2_ONE_OK, [OK], 2, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)),
    ("T3 failed + ok", tx.T3_FAILED_THEN_OK, [ERR, OK], 3, (0.5, 0.0, 0.5), (0.5, 0.0, 0.5)),
    ("T4 timed out", tx.T4_TIMED_OUT, [TIMEOUT], 2, (0.0, 0.0, 0.0), (1.0, 0.0, 1.0)),
    (
        "T5 JSON failure + ok",
        tx.T5_JSON_FAILURE_THEN_OK,
        [PARSE, OK],
        3,
        (0.0, 0, 0),
        (0.5, 0, 0.5),
    ),
    ("T6 two answers", tx.T6_TWO_ANSWERS, [OK], 2, (0.0, 1.0, 1.0), (0.0, 0.5, 0.5)),
    ("T7 no answer tag", tx.T7_NO_ANSWER_TAG, [OK], 2, (0.0, 1.0, 1.0), (0.0, 1.0, 1.0)),
    ("T8 ok prints error", tx.T8_OK_PRINTS_ERROR, [OK], 2, (1.0, 0.0, 1.0), (0.0, 0.0, 0.0)),
]


@pytest.mark.parametrize(("name", "text", "results", "turns", "release", "paper"), TABLE)
def test_penalty_table(
    name: str,
    text: str,
    results: list[Any],
    turns: int,
    release: tuple[float, ...],
    paper: tuple[float, ...],
) -> None:
    assert (p_err_release(text), p_format_release(text)) == pytest.approx(release[:2]), name
    assert (p_err(results), p_format(text, turns)) == pytest.approx(paper[:2]), name
    release_total = total_penalty(
        text, results, turns, err_detector="release", format_rule="release"
    )
    assert release_total == pytest.approx(release[2])
    assert total_penalty(text, results, turns) == pytest.approx(paper[2])


def test_release_turn_regex_sees_one_turn_fewer_than_were_generated() -> None:
    # The first assistant header is in the prompt: only tool rounds open a counted turn.
    assert tx.T3_FAILED_THEN_OK.count("<|im_start|>assistant") == 2
    assert tx.T1_NO_TOOL.count("<|im_start|>assistant") == 0


def test_every_failure_of_the_program_counts_as_failed() -> None:
    for status in ("error", "timeout", "memory_limit", "killed"):
        assert is_failed(result(status)), status
    assert is_failed(PARSE)
    assert not is_failed(OK)
    assert {"parse_error"} <= FAILED_STATUSES


def test_a_call_the_service_failed_is_not_the_models_tool_error() -> None:
    # queue_timeout and sandbox_error say nothing about the program: p_err leaves them out.
    lost = [result("queue_timeout"), result("sandbox_error")]
    for r in lost:
        assert not is_failed(r) and is_infrastructure_failure(r)
    assert p_err([OK, *lost]) == 0.0
    assert p_err([ERR, OK, *lost]) == pytest.approx(0.5)
    assert p_err(lost) == 0.0  # the model did call the tool: not the no-call 0.5
    assert positive_tool_error_ratio([1.0, 1.0], [[OK, lost[0]], [lost[1]]]) == 0.0


def test_results_may_be_mappings_objects_or_enums() -> None:
    from sandbox_service.execution import ExecutionResult, Status

    @dataclass
    class Plain:
        status: str

    results = [
        {"status": "ok"},
        Plain("timeout"),
        ExecutionResult(status=Status.MEMORY_LIMIT),
        ExecutionResult(status=Status.OK),
    ]
    assert p_err(results) == pytest.approx(0.5)


def test_unknown_status_is_refused_rather_than_guessed() -> None:
    with pytest.raises(ValueError, match="unknown tool-result status"):
        p_err([{"status": "success"}])


def test_p_err_is_the_failed_share() -> None:
    assert p_err([OK, OK, OK, ERR]) == pytest.approx(0.25)
    assert p_err([TIMEOUT, PARSE, ERR]) == 1.0
    assert p_err([]) == 0.5


def test_p_format_paper_rule() -> None:
    three_answers = "<answer>1</answer> <answer>2</answer> <answer>\\boxed{3}</answer>"
    assert p_format(three_answers, 4) == pytest.approx(0.5)
    assert p_format(three_answers, 2) == 1.0  # capped at 1
    assert p_format("no tags, just \\boxed{3}", 5) == 1.0
    assert p_format("<answer>\\boxed{3}</answer>", 1) == 0.0
    with pytest.raises(ValueError):
        p_format("<answer>x</answer>", 0)


def test_p_format_release_rejects_unbalanced_tags() -> None:
    turn = "<|im_start|>assistant\n<reason>r</reason><|im_end|>"
    assert p_format_release(turn + "<answer>\\boxed{3}") == 1.0  # never closed
    assert p_format_release(turn + "<answer>a</answer></answer>") == 1.0
    assert p_format_release(turn + "<answer>\\boxed{3}</answer>") == 0.0


def test_penalties_can_be_left_out() -> None:
    text = tx.T1_NO_TOOL
    assert total_penalty(text, [], 1, use_err=False) == 0.0
    assert total_penalty(text, [], 1, use_format=False) == 0.5
    assert total_penalty(text, [], 1, use_err=False, use_format=False) == 0.0
