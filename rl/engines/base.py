"""What the rollout loop needs of an inference engine: one async call per assistant turn.

Three engines implement it: `rl.engines.hf.TransformersEngine` (in process, CPU or GPU),
`rl.engines.vllm_colocated.VLLMEngine` (in process, colocated with the trainer, when vllm is
installed) and `rl.engines.openai_api.OpenAIEngine` (any OpenAI-compatible server, for
evaluation). The scheduler (`rl.rollout.scheduler`) hands each rollout to one engine by its free
KV-cache capacity in tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one turn is sampled."""

    max_new_tokens: int
    """The most tokens this call may generate (the rollout's remaining budget)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 keeps the whole distribution."""
    stop: tuple[str, ...] = ()
    """Generation stops right after any of these strings (they are kept in the output)."""
    stop_token_ids: tuple[int, ...] = ()
    """Generation stops right after any of these tokens (kept in the output)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("need temperature >= 0 and 0 < top_p <= 1")


@dataclass(frozen=True, slots=True)
class Generation:
    """One turn as sampled: tokens, their log-probabilities, why it stopped."""

    token_ids: list[int]
    """The sampled tokens, the stop string's or stop token's included."""
    logprobs: list[float] | None
    """log p of each sampled token under the sampling distribution (temperature applied);
    None when the engine cannot say (some servers)."""
    finish_reason: FinishReason
    """"stop": a stop string or token ended it; "length": max_new_tokens did."""
    stop: str | int | None = None
    """The stop string or token id that ended it, if any."""
    text: str = field(default="", compare=False)
    """The decoded tokens, when the engine has them at hand (informational)."""


@runtime_checkable
class Engine(Protocol):
    """An inference engine that generates one assistant turn per call, many calls at once."""

    @property
    def name(self) -> str:
        """Identifies the engine in logs and utilisation reports."""
        ...

    @property
    def capacity_tokens(self) -> int:
        """KV-cache capacity in tokens: the scheduler never reserves more than this."""
        ...

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample one continuation of prompt_ids; many may be awaited concurrently."""
        ...


def find_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """(end index, stop) of the earliest stop string in text, or None."""
    best: tuple[int, str] | None = None
    for stop in stops:
        if not stop:
            continue
        i = text.find(stop)
        if i != -1 and (best is None or i + len(stop) < best[0]):
            best = (i + len(stop), stop)
    return best
