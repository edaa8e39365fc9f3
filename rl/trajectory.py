"""What one rollout produced: tokens, which of them the policy is trained on, and its tool calls.

Pure data. The response is everything after the prompt: the model's own turns (loss mask 1, with
the log-probabilities they were sampled with) and, between them, the unsampled text the rollout
loop appended (end of a turn cut at `</tool_call>`, tool responses, the next turn's header; mask 0,
log-prob 0.0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["answer", "no_tool_call", "max_turns", "max_tokens"]
"""Why a rollout ended: an <answer> block; a turn with neither answer nor call; the turn limit;
the response-token budget (the only one that counts as truncated, reward 0, paper §4.3.1)."""


@dataclass(frozen=True, slots=True)
class ToolRecord:
    """One tool call the model made and what it was shown."""

    turn: int
    """The assistant turn (1-based) that made the call."""
    status: str
    """The service's ExecuteResult.status, or "parse_error" for a call that could not be run,
    or "sandbox_error" when the service gave no result."""
    text: str
    """The tool response the model was shown."""
    code: str | None = None
    """The program, when the call could be read."""
    result: object | None = None
    """The service's ExecuteResult, when there was one."""
    latency_s: float = 0.0
    """From sending the call to having its result."""


@dataclass(slots=True)
class Trajectory:
    """One rollout of one prompt."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    """Every token after the prompt, generated or appended."""
    loss_mask: list[int] = field(default_factory=list)
    """1 on tokens the model sampled, 0 on appended ones; len == len(response_ids)."""
    logprobs: list[float] = field(default_factory=list)
    """Sampling log-probability of each response token (0.0 where the mask is 0)."""
    tool_results: list[ToolRecord] = field(default_factory=list)
    """The calls whose responses the model saw, in order."""
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    """[start, end) of each assistant turn's sampled tokens within response_ids."""
    finish_reason: FinishReason = "no_tool_call"
    response_text: str = ""
    """The response decoded with special tokens kept (what the penalties read)."""
    generated_text: str = ""
    """Only the model's own turns, decoded and joined (what the reward reads: a tool's output
    cannot put an <answer> in the model's mouth)."""
    engine: str = ""
    """The engine that generated it."""
    group: int = 0
    """Index of its prompt in the step (the GRPO group)."""
    generation_s: float = 0.0
    """Wall time from the first to the last token, tool calls included."""

    @property
    def num_turns(self) -> int:
        """Assistant turns generated."""
        return len(self.turn_spans)

    @property
    def truncated(self) -> bool:
        """Ended by the token budget: scored 0 whatever it says."""
        return self.finish_reason == "max_tokens"

    @property
    def num_generated(self) -> int:
        """Tokens the model sampled."""
        return sum(self.loss_mask)

    def check(self) -> None:
        """Raise if the parallel lists disagree (a bug in whoever built it)."""
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise AssertionError(
                f"response {n}, mask {len(self.loss_mask)}, logprobs {len(self.logprobs)}"
            )
        for start, end in self.turn_spans:
            if not 0 <= start < end <= n or any(m != 1 for m in self.loss_mask[start:end]):
                raise AssertionError(f"turn span {(start, end)} is not sampled tokens")
