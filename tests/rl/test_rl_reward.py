"""answer_reward on model-output-like responses: equivalent forms, wrong answers, missing tags,
and pathological answers that must be cut off at the time limit."""

from __future__ import annotations

import time

import pytest
import rl_transcripts as tx
from rl_limits import LIMIT_S, MARGIN_S

from rl.config import GRPOConfig
from rl.reward.outcome import answer_reward, answer_rewards, grade_responses, verifier_from_config
from rl.reward.verifier import VerifierPool


def final_turn(answer_latex: str, words: str = "The answer is") -> str:
    """A multi-turn response whose last turn boxes answer_latex inside <answer>."""
    return (
        "I will check the arithmetic with Python.</reason>"
        + tx.tool_call("print(sum(range(10)))")
        + tx.tool_turn("Tool call success\nstdout: 45\nexecution time: 0.02s")
        + "The computation agrees with the derivation.</reason>\n"
        + f"<answer>\n{words} $\\boxed{{{answer_latex}}}$.\n</answer><|im_end|>"
    )


EQUIVALENT = [
    ("\\dfrac{3}{4}", "\\frac{3}{4}"),
    ("\\frac34", "0.75"),
    ("0.75", "\\frac{3}{4}"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\sqrt{8}", "2\\sqrt{2}"),
    ("1,000,000", "1000000"),
    ("1\\,000\\,000", "1000000"),
    ("1{,}000{,}000", "1000000"),
    ("2^{10}", "1024"),
    ("\\frac{\\pi}{2}", "\\pi/2"),
    ("1.5707963", "\\frac{\\pi}{2}"),  # within the numeric tolerance
    ("72^\\circ", "72"),
    ("x = 17", "17"),
    ("\\text{17}", "17"),
    ("-\\frac{1}{2}", "-0.5"),
]

DIFFERENT = [
    ("1023", "1024"),
    ("-5", "5"),
    ("\\frac{1}{2}", "2"),
    ("1.57", "\\frac{\\pi}{2}"),  # a rounding, not the value
    ("2\\sqrt{3}", "\\sqrt{8}"),
    ("999999999999999999", "1000000000000000000"),  # integers are compared exactly
    ("1024.5", "1024"),
    ("\\text{no idea}", "12"),
]


def test_a_real_multi_turn_response(verifier: VerifierPool) -> None:
    response = (
        "We need the number of positive divisors of $2^{10} \\cdot 3^2$.</reason>"
        + tx.tool_call("from sympy import divisor_count\nprint(divisor_count(2**10 * 3**2))")
        + tx.tool_turn("Tool call success\nstdout: 33\nexecution time: 0.31s")
        + "Each divisor is $2^a 3^b$ with $0 \\le a \\le 10$, $0 \\le b \\le 2$, so there are "
        "$(10+1)(2+1) = 33$.</reason>\n<answer>\nThe number of positive divisors is "
        "$\\boxed{33}$.\n</answer><|im_end|>"
    )
    assert answer_reward(response, "33") == 1.0
    assert answer_reward(response, "32") == 0.0


@pytest.mark.parametrize(("answer", "truth"), EQUIVALENT)
def test_equivalent_forms_score_1(verifier: VerifierPool, answer: str, truth: str) -> None:
    assert answer_reward(final_turn(answer), truth) == 1.0


@pytest.mark.parametrize(("answer", "truth"), DIFFERENT)
def test_wrong_answers_score_0(verifier: VerifierPool, answer: str, truth: str) -> None:
    assert answer_reward(final_turn(answer), truth) == 0.0


def test_missing_tags_score_0_unless_falling_back(verifier: VerifierPool) -> None:
    assert answer_reward(tx.T7_NO_ANSWER_TAG, "4") == 0.0
    assert answer_reward(tx.T7_NO_ANSWER_TAG, "4", fallback_to_last_boxed=True) == 1.0
    unboxed = "Easy.</reason><answer>The answer is 4.</answer><|im_end|>"
    assert answer_reward(unboxed, "4") == 0.0
    truncated = "Long derivation ... so the answer is <answer>\\boxed{4"
    assert answer_reward(truncated, "4") == 0.0


def test_only_the_answer_block_counts(verifier: VerifierPool) -> None:
    response = "Maybe \\boxed{5}? No, recheck.</reason><answer>\\boxed{6}</answer><|im_end|>"
    assert answer_reward(response, "6") == 1.0
    assert answer_reward(response, "5") == 0.0


def test_empty_ground_truth_is_a_data_error(verifier: VerifierPool) -> None:
    with pytest.raises(ValueError):
        answer_reward(final_turn("3"), " ")


@pytest.mark.parametrize(
    "answer",
    [
        "9^{9^{9^9}}",  # a power tower: evaluating it never ends
        "3^{10^{8}}",
        "(10^{10^{7}})!",
    ],
)
def test_pathological_answers_are_cut_off_at_the_limit(verifier: VerifierPool, answer: str) -> None:
    start = time.monotonic()
    reward = answer_reward(final_turn(answer), "1024")
    elapsed = time.monotonic() - start
    assert reward == 0.0
    assert elapsed < LIMIT_S + MARGIN_S, elapsed
    # and the pool still judges the next answer right
    assert answer_reward(final_turn("2^{10}"), "1024", verifier=verifier) == 1.0


def test_the_limit_holds_when_only_sigkill_can_stop_the_check(hard_verifier: VerifierPool) -> None:
    restarts = hard_verifier.restarts
    start = time.monotonic()
    reward = answer_reward(final_turn("9^{9^{9^9}}"), "1024", verifier=hard_verifier)
    elapsed = time.monotonic() - start
    assert reward == 0.0
    assert LIMIT_S * 0.9 < elapsed < LIMIT_S + MARGIN_S, elapsed
    assert hard_verifier.restarts == restarts + 1  # the worker was killed and replaced


def test_a_batch_with_hanging_answers(verifier: VerifierPool) -> None:
    responses = [final_turn(a) for a in ("33", "9^{9^{9^9}}", "\\frac{66}{2}", "34")] * 2
    responses.append(tx.T7_NO_ANSWER_TAG)
    start = time.monotonic()
    grades = grade_responses(responses, ["33"] * len(responses))
    elapsed = time.monotonic() - start
    assert [g.reward for g in grades] == [1.0, 0.0, 1.0, 0.0] * 2 + [0.0]
    assert [g.verdict.status for g in grades[:4] if g.verdict] == ["ok", "timeout", "ok", "ok"]
    assert grades[-1].answer is None and grades[-1].verdict is None
    # two workers, two hanging items: about one limit each in parallel, plus the rest
    assert elapsed < 2 * LIMIT_S + 2 * MARGIN_S, elapsed
    assert answer_rewards([final_turn("33")], ["33"]) == [1.0]


def test_a_pool_from_the_config() -> None:
    config = GRPOConfig(verify_workers=1, verify_timeout_s=LIMIT_S)
    with verifier_from_config(config) as pool:
        assert (pool.size, pool.timeout_s, pool.rel_tol) == (1, LIMIT_S, config.verify_rel_tol)
        assert answer_reward(final_turn("\\frac{66}{2}"), "33", verifier=pool) == 1.0
