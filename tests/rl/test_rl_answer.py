"""Extracting the final answer: the last \\boxed{} inside <answer>, with the release's fallback."""

from __future__ import annotations

import rl_transcripts as tx

from rl.reward.answer import extract_answer, last_boxed

QWEN_STYLE = (
    "We need the number of positive divisors of $2^{10} \\cdot 3^2$.</reason>"
    + tx.tool_call("from sympy import divisor_count\nprint(divisor_count(2**10 * 3**2))")
    + tx.tool_turn("Tool call success\nstdout: 33\nexecution time: 0.31s")
    + "The tool confirms $(10+1)(2+1) = 33$.</reason>\n<answer>\nThe number of positive "
    "divisors is $\\boxed{33}$.\n</answer><|im_end|>"
)


def test_the_boxed_answer_inside_the_answer_block() -> None:
    assert extract_answer(QWEN_STYLE) == "33"


def test_nested_braces_and_latex() -> None:
    text = "<answer>So $x = \\boxed{\\dfrac{\\sqrt{3}}{2}}$ and we are done.</answer>"
    assert extract_answer(text) == "\\dfrac{\\sqrt{3}}{2}"
    assert last_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"  # escaped braces are not grouping
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed {12}") == "12"


def test_the_last_boxed_of_the_last_answer_block_wins() -> None:
    text = (
        "<answer>\\boxed{12}</answer> wait, recheck "
        "<answer>first \\boxed{13}, so \\boxed{14}</answer>"
    )
    assert extract_answer(text) == "14"


def test_a_boxed_outside_the_answer_block_is_not_the_answer() -> None:
    text = "<reason>maybe \\boxed{5}?</reason><answer>\\boxed{6}</answer>"
    assert extract_answer(text) == "6"


def test_missing_answer_tags_score_nothing_unless_falling_back() -> None:
    text = tx.T7_NO_ANSWER_TAG  # "So it is \boxed{4}." with no <answer>
    assert extract_answer(text) is None
    assert extract_answer(text, fallback_to_last_boxed=True) == "4"


def test_an_answer_block_without_boxed() -> None:
    text = "<reason>it is \\boxed{8}</reason><answer>The answer is 8.</answer>"
    assert extract_answer(text) is None
    assert extract_answer(text, fallback_to_last_boxed=True) == "8"


def test_truncated_responses() -> None:
    assert extract_answer("<answer>The answer is \\boxed{12") is None  # cut off by the budget
    assert extract_answer("<answer>The answer is \\boxed{12}") is None  # </answer> never came
    assert last_boxed("\\boxed{1} and \\boxed{2") is None  # the final one is unclosed
    assert extract_answer("<answer>\\boxed{}</answer>") is None
    assert extract_answer("<answer>\\boxed{  }</answer>") is None
