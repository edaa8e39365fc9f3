"""Penalties that rank correct trajectories for Resample-on-Correct (paper Eq. 4-5).

Lower is cleaner. p_total = p_err + p_format lies in [0, 2].

- `p_err`: the share of the model's tool calls that failed, from the service's structured
  results; 0.5 when the trajectory made no tool call (to encourage tool use). A call the service
  itself failed (queue_timeout, sandbox_error) is the infrastructure's failure, not the model's:
  it counts neither way, and a trajectory whose every call was lost so scores 0.0.
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

FAILED_STATUSES = frozenset({"error", "timeout", "memory_limit", "killed", "parse_error"})
"""Statuses of a call that failed by the model's doing: the service's (ExecuteResult.status) plus
"parse_error", which the rollout loop records for a tool call it could not decode or dispatch."""
INFRASTRUCTURE_STATUSES = frozenset(
    {"queue_timeout", "sandbox_error", "cancelled", "deadline_exceeded"}
)
"""Statuses of a call the service could not run or answer: the program is not to blame (a busy
queue, a lost worker, a client that gave up), so Resample-on-Correct must not rank by them."""
OK_STATUSES = frozenset({"ok"})
_KNOWN_STATUSES = FAILED_STATUSES | INFRASTRUCTURE_STATUSES | OK_STATUSES

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
    if status not in _KNOWN_STATUSES:
        raise ValueError(f"unknown tool-result status {status!r}")
    return status


def is_failed(result: ToolResult | Mapping[str, Any]) -> bool:
    """Whether one tool call failed by the model's doing (error, time-out, memory, parse, ...)."""
    return _status(result) in FAILED_STATUSES


def is_infrastructure_failure(result: ToolResult | Mapping[str, Any]) -> bool:
    """Whether the service could not run or answer the call (queue_timeout, sandbox_error,
    cancelled, deadline_exceeded)."""
    return _status(result) in INFRASTRUCTURE_STATUSES


def p_err(tool_results: Sequence[ToolResult | Mapping[str, Any]]) -> float:
    """The model's failed calls / the model's calls (Eq. 4); 0.5 with no tool call at all."""
    if not tool_results:
        return 0.5
    statuses = [_status(result) for result in tool_results]
    judged = [s for s in statuses if s not in INFRASTRUCTURE_STATUSES]
    if not judged:
        return 0.0
    return sum(s in FAILED_STATUSES for s in judged) / len(judged)


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
