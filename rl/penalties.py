"""Penalties that rank correct trajectories for Resample-on-Correct (paper Eq. 4-5).

Lower is cleaner. p_total = p_err + p_format lies in [0, 2].

- `p_err`: the share of tool calls that failed, from the service's structured results; 0.5 when
  the trajectory made no tool call (to encourage tool use).
- `p_format`: 1 when there is no `<answer>`; else min(1, (answers - 1) / turns).

The release computes both from the decoded text instead (`p_err_release`, `p_format_release`):
a tool response counts as failed when it contains the substring "error", which misses time-outs
and JSON-parse failures and flags a correct program that prints "error"; and its turn count
misses the first assistant turn, whose header belongs to the prompt. Both are kept, selectable,
so tests can pin the release's numbers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rl.config import ErrDetector, FormatRule

FAILED_STATUSES = frozenset(
    {"error", "timeout", "memory_limit", "killed", "queue_timeout", "sandbox_error", "parse_error"}
)
"""Statuses of a failed call: the service's (sandbox_service ExecuteResult.status) plus
"parse_error", which the rollout loop records for a tool call it could not decode or dispatch.
queue_timeout and sandbox_error are counted too: the model was shown a failure either way."""
OK_STATUSES = frozenset({"ok"})

_TOOL_RESPONSE = re.compile(r"<tool_response>.*?</tool_response>", re.DOTALL)
_ANSWER_PAIR = re.compile(r"<answer>.*?</answer>", re.DOTALL)
_ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant.*?<\|im_end\|>", re.DOTALL)


class ToolResult(Protocol):
    """Anything with the status of one tool call, such as the service's ExecuteResult."""

    @property
    def status(self) -> str: ...


def _status(result: ToolResult | Mapping[str, Any]) -> str:
    status = result["status"] if isinstance(result, Mapping) else result.status
    status = str(getattr(status, "value", status))
    if status not in FAILED_STATUSES and status not in OK_STATUSES:
        raise ValueError(f"unknown tool-result status {status!r}")
    return status


def is_failed(result: ToolResult | Mapping[str, Any]) -> bool:
    """Whether one tool call failed (error, time-out, memory, kill, parse failure, ...)."""
    return _status(result) in FAILED_STATUSES


def p_err(tool_results: Sequence[ToolResult | Mapping[str, Any]]) -> float:
    """Failed tool calls / tool calls (Eq. 4); 0.5 with no tool call."""
    if not tool_results:
        return 0.5
    return sum(is_failed(result) for result in tool_results) / len(tool_results)


def p_err_release(response: str) -> float:
    """The release's p_err: share of <tool_response> blocks containing "error" (any case)."""
    blocks = _TOOL_RESPONSE.findall(response)
    if not blocks:
        return 0.5
    return sum("error" in block.lower() for block in blocks) / len(blocks)


def p_format(response: str, num_turns: int) -> float:
    """1 without <answer>; else min(1, (answer tags - 1) / assistant turns) (Eq. 5)."""
    if num_turns < 1:
        raise ValueError(f"num_turns must be at least 1, got {num_turns}")
    answers = response.count("<answer>")
    if answers == 0:
        return 1.0
    return min(1.0, (answers - 1) / num_turns)


def p_format_release(response: str) -> float:
    """The release's p_format: closed-pair count, turns counted by a regex that skips turn one."""
    if "<answer>" not in response or "</answer>" not in response:
        return 1.0
    pairs = len(_ANSWER_PAIR.findall(response))
    if response.count("<answer>") != pairs or response.count("</answer>") != pairs:
        return 1.0
    turns = len(_ASSISTANT_TURN.findall(response))
    if turns == 0:
        return 1.0
    return min((pairs - 1) / turns, 1.0)


def total_penalty(
    response: str,
    tool_results: Sequence[ToolResult | Mapping[str, Any]],
    num_turns: int,
    *,
    err_detector: ErrDetector = "structured",
    format_rule: FormatRule = "paper",
    use_err: bool = True,
    use_format: bool = True,
) -> float:
    """p_total = p_err + p_format of one trajectory, each by the chosen rule (or left out)."""
    total = 0.0
    if use_err:
        if err_detector == "structured":
            total += p_err(tool_results)
        elif err_detector == "release":
            total += p_err_release(response)
        else:
            raise ValueError(f"unknown err_detector {err_detector!r}")
    if use_format:
        if format_rule == "paper":
            total += p_format(response, num_turns)
        elif format_rule == "release":
            total += p_format_release(response)
        else:
            raise ValueError(f"unknown format_rule {format_rule!r}")
    return total
