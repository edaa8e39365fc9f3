"""Step diagnostics: the paper's Fig. 4 tool-error ratio among correct trajectories."""

from __future__ import annotations

import pytest
import rl_transcripts as tx

from rl.diagnostics import answer_tag_counts, positive_tool_error_ratio


def test_only_correct_trajectories_count() -> None:
    ok, err, timeout = {"status": "ok"}, {"status": "error"}, {"status": "timeout"}
    rewards = [1.0, 1.0, 0.0, 1.0]
    results = [[ok, err, ok, ok], [timeout], [err, err, err], []]
    # correct ones: 4 + 1 + 0 calls, of which 1 + 1 failed; the wrong one's errors do not count
    assert positive_tool_error_ratio(rewards, results) == pytest.approx(2 / 5)
    assert positive_tool_error_ratio([0.0], [[err]]) == 0.0
    with pytest.raises(ValueError):
        positive_tool_error_ratio([1.0], [])


def test_answer_tag_counts() -> None:
    got = answer_tag_counts([tx.T2_ONE_OK, tx.T6_TWO_ANSWERS, tx.T7_NO_ANSWER_TAG, tx.T1_NO_TOOL])
    assert got == {
        "answers_per_response": 1.0,
        "zero_answer": 1.0,
        "one_answer": 2.0,
        "more_answers": 1.0,
    }
