"""Per-step numbers worth logging for GRPO-RoC (pure, from a step's rollouts).

The paper's Fig. 4 diagnostic is the share of failed tool calls inside *correct* trajectories:
under plain GRPO it plateaus (about 10-15 %), under Resample-on-Correct it keeps falling. The
answer-tag counts are the release's roc_answer_format metrics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rl.penalties import ToolResult, is_failed, is_infrastructure_failure
from rl.trajectory import Trajectory


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


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def step_metrics(
    trajectories: Sequence[Trajectory], correct: Sequence[float], rewards: Sequence[float]
) -> dict[str, Any]:
    """The rollout side of a step's metrics line."""
    calls = [r for t in trajectories for r in t.tool_results]
    judged = [r for r in calls if not is_infrastructure_failure(r)]
    lengths = [len(t.response_ids) for t in trajectories]
    groups: dict[int, bool] = {}
    for t, r in zip(trajectories, rewards, strict=True):
        groups[t.group] = groups.get(t.group, False) or r > 0
    finish: dict[str, int] = {}
    for t in trajectories:
        finish[t.finish_reason] = finish.get(t.finish_reason, 0) + 1
    return {
        "reward_mean": _mean(rewards),
        "accuracy": _mean(correct),
        "group_solve_rate": _mean([float(v) for v in groups.values()]),
        "rollouts": len(trajectories),
        "tool_error_ratio_pos": positive_tool_error_ratio(
            rewards, [t.tool_results for t in trajectories]
        ),
        "tool_error_ratio": _mean([float(is_failed(r)) for r in judged]),
        "sandbox_failure_ratio": _mean([float(is_infrastructure_failure(r)) for r in calls]),
        "tool_calls_per_rollout": len(calls) / max(len(trajectories), 1),
        "no_tool_frac": _mean([float(not t.tool_results) for t in trajectories]),
        "tool_latency_mean_s": _mean([r.latency_s for r in calls if r.result is not None]),
        "response_len_mean": _mean([float(n) for n in lengths]),
        "response_len_max": max(lengths, default=0),
        "generated_len_mean": _mean([float(t.num_generated) for t in trajectories]),
        "turns_mean": _mean([float(t.num_turns) for t in trajectories]),
        "truncated_frac": _mean([float(t.truncated) for t in trajectories]),
        "finish": finish,
        **answer_tag_counts([t.generated_text for t in trajectories]),
    }
