"""Per-step numbers worth logging for GRPO-RoC (pure, from a step's rollouts).

The paper's Fig. 4 diagnostic is the share of failed tool calls inside *correct* trajectories:
under plain GRPO it plateaus (about 10-15 %), under Resample-on-Correct it keeps falling. The
answer-tag counts are the release's roc_answer_format metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rl.penalties import ToolResult, is_failed, is_infrastructure_failure


def positive_tool_error_ratio(
    rewards: Sequence[float], tool_results: Sequence[Sequence[ToolResult | Mapping[str, Any]]]
) -> float:
    """The model's failed calls / its calls, over trajectories with reward > 0 (0.0 if none).

    Calls the service failed (queue_timeout, sandbox_error) are left out, as in p_err.
    """
    if len(rewards) != len(tool_results):
        raise ValueError(f"{len(rewards)} rewards but {len(tool_results)} tool-result lists")
    calls = failed = 0
    for reward, results in zip(rewards, tool_results, strict=True):
        if reward > 0:
            judged = [r for r in results if not is_infrastructure_failure(r)]
            calls += len(judged)
            failed += sum(is_failed(r) for r in judged)
    return failed / calls if calls else 0.0


def answer_tag_counts(responses: Sequence[str]) -> dict[str, float]:
    """Mean <answer> tags per response and how many responses have 0, 1 or more of them."""
    counts = [response.count("<answer>") for response in responses]
    return {
        "answers_per_response": sum(counts) / len(counts) if counts else 0.0,
        "zero_answer": float(sum(c == 0 for c in counts)),
        "one_answer": float(sum(c == 1 for c in counts)),
        "more_answers": float(sum(c > 1 for c in counts)),
    }
