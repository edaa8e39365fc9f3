"""The outcome reward (paper Eq. 3): 1.0 when the final answer equals the ground truth, else 0.0.

The answer is the last `\\boxed{}` inside `<answer>...</answer>` (`rl.reward.answer`); it is
judged by math-verify in a worker process under a hard time limit (`rl.reward.verifier`). A
time-out, a crash or a missing answer scores 0.0. No format reward, no tool penalty, no length
penalty; a truncated rollout is given 0.0 by the caller, who knows it was truncated (paper
§4.3.1).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from rl.config import GRPOConfig
from rl.reward.answer import extract_answer
from rl.reward.verifier import Verdict, VerifierPool

MAX_ANSWER_CHARS = 4096
"""A longer boxed answer is scored 0.0 unchecked: no real answer is this long, and parsing one
costs time that other checks need."""

_default_pool: VerifierPool | None = None
_default_lock = threading.Lock()


def verifier_from_config(config: GRPOConfig) -> VerifierPool:
    """A pool with the config's workers, time limit and tolerance; the trainer's owns one."""
    return VerifierPool(
        workers=config.verify_workers,
        timeout_s=config.verify_timeout_s,
        rel_tol=config.verify_rel_tol,
    )


def default_verifier() -> VerifierPool:
    """The shared pool used when none is passed (2 workers, 5 s limit), started on first use."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = VerifierPool()
            atexit.register(_default_pool.close)
        return _default_pool


@dataclass(frozen=True, slots=True)
class Grade:
    """One response's reward and how it came about, for logging."""

    reward: float
    answer: str | None
    """The extracted answer; None when the response had none."""
    verdict: Verdict | None
    """The verifier's verdict; None when nothing was checked."""


def grade_responses(
    responses: Sequence[str],
    ground_truths: Sequence[str],
    *,
    fallback_to_last_boxed: bool = False,
    verifier: VerifierPool | None = None,
) -> list[Grade]:
    """Grade many responses in parallel on the verifier's workers, each check time-limited."""
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
    for truth in ground_truths:
        if not truth.strip():
            raise ValueError("empty ground truth")
    answers = [extract_answer(r, fallback_to_last_boxed=fallback_to_last_boxed) for r in responses]
    to_check = [
        i
        for i, answer in enumerate(answers)
        if answer is not None and len(answer) <= MAX_ANSWER_CHARS
    ]
    verdicts: dict[int, Verdict] = {}
    if to_check:
        pool = verifier if verifier is not None else default_verifier()
        checked = pool.check_many([(answers[i] or "", ground_truths[i]) for i in to_check])
        verdicts = dict(zip(to_check, checked, strict=True))
    grades = []
    for i, answer in enumerate(answers):
        verdict = verdicts.get(i)
        reward = 1.0 if verdict is not None and verdict.equal else 0.0
        grades.append(Grade(reward, answer, verdict))
    return grades


def answer_rewards(
    responses: Sequence[str],
    ground_truths: Sequence[str],
    *,
    fallback_to_last_boxed: bool = False,
    verifier: VerifierPool | None = None,
) -> list[float]:
    """0.0/1.0 rewards for many responses; the way a trainer should call the verifier."""
    grades = grade_responses(
        responses, ground_truths, fallback_to_last_boxed=fallback_to_last_boxed, verifier=verifier
    )
    return [grade.reward for grade in grades]


def answer_reward(
    response: str,
    ground_truth: str,
    *,
    fallback_to_last_boxed: bool = False,
    verifier: VerifierPool | None = None,
) -> float:
    """1.0 if the final boxed answer in <answer> equals ground_truth, else 0.0; time-limited."""
    if not ground_truth.strip():
        raise ValueError("empty ground truth")
    answer = extract_answer(response, fallback_to_last_boxed=fallback_to_last_boxed)
    if answer is None or len(answer) > MAX_ANSWER_CHARS:
        return 0.0
    pool = verifier if verifier is not None else default_verifier()
    return 1.0 if pool.check(answer, ground_truth).equal else 0.0
