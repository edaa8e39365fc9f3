"""The agentic rollout loop: generate a turn, run its tool call at once, append the response.

One coroutine per rollout; a step runs hundreds concurrently (`rl.rollout.scheduler`). A turn is
sampled until `</tool_call>` or the end of the turn. A tool call goes to the sandbox the moment
its turn stops: no rollout waits for the others' turns (the paper's "no per-turn barrier",
§3.2). The tool response and the next turn's header are appended unsampled, with loss mask 0. A
rollout stops on the first turn without a tool call (finish "answer" when it holds an
`<answer>` block, as the release: a turn with an answer and a call still runs the call), the turn
limit, or the response-token budget (tool responses count against it, and a
rollout never ends on a tool response: if the response does not fit, it stops before it, as the
release does).

One call per turn: generation stops at the first `</tool_call>` (the release executes only the
first call of a turn too). This module is the rollout's only edge to the sandbox: it reads tool
calls and renders results with trainer_client's pure helpers and sends them through any object
with SandboxClient.execute.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rl.engines.base import Engine, Generation, SamplingParams
from rl.rollout.template import PromptTemplate
from rl.trajectory import FinishReason, ToolRecord, Trajectory
from trainer_client.errors import InvalidRequestError, SandboxClientError
from trainer_client.tools import (
    PYTHON_TOOL_NAME,
    Executes,
    ResponseStyle,
    ToolCall,
    format_parse_error,
    format_tool_response,
    parse_tool_calls,
)


class Codec(Protocol):
    """Text <-> token ids, special tokens kept (an HF tokenizer wrapped by `HFCodec`)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of text, no BOS/EOS added."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids, special tokens kept."""
        ...


class HFCodec:
    """A transformers tokenizer as a Codec."""

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        """Token ids of text, no BOS/EOS added."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids, special tokens kept."""
        text = self.tokenizer.decode(list(ids), skip_special_tokens=False)  # type: ignore[attr-defined]
        return str(text)


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    """Limits and sampling of one rollout (one stage's values)."""

    max_turns: int = 10
    """Assistant turns at most (paper: 10 in stages 1-2, 15 in stage 3)."""
    max_response_tokens: int = 8192
    """Response tokens at most, tool responses included."""
    temperature: float = 1.0
    """Sampling temperature (paper: 1.0 in training, 0.6 in evaluation)."""
    top_p: float = 1.0
    """Nucleus mass."""
    tool_timeout_s: float = 4.0
    """Wall-clock limit of one tool program (the release's 4 s)."""
    tool_response_chars: int | None = 256
    """Tool responses are cut in the middle to this many characters (VERL's 256); None: never."""
    response_style: ResponseStyle = "rstar2"
    """How failures are worded to the model (trainer_client.tools.format_tool_response)."""
    stop_token_ids: tuple[int, ...] = ()
    """End-of-turn token ids (the tokenizer's <|im_end|>, EOS)."""

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_response_tokens < 1:
            raise ValueError("max_turns and max_response_tokens must be at least 1")
        if self.tool_timeout_s <= 0:
            raise ValueError("tool_timeout_s must be positive")


def _ended_turn(
    generation: Generation, text: str, template: PromptTemplate, settings: RolloutSettings
) -> bool:
    """Whether the sampled turn already holds its end-of-turn token.

    From the tokens, not only the engine's stop field: vLLM reports stop_reason None when the
    end-of-turn token is the model's EOS, and the token is in the output all the same.
    """
    if generation.stop == template.turn_end or generation.stop in settings.stop_token_ids:
        return True
    ids = generation.token_ids
    return (bool(ids) and ids[-1] in settings.stop_token_ids) or text.endswith(template.turn_end)


def _has_answer(text: str) -> bool:
    start = text.find("<answer>")
    return start != -1 and text.find("</answer>", start) != -1


async def execute_call(
    tools: Executes, call: ToolCall, turn: int, settings: RolloutSettings
) -> ToolRecord:
    """Run one parsed call; the model's mistakes come back as parse_error records, not raised.

    Like trainer_client.tools.execute_tool_call (same wording), but keeping the structured
    status, which Resample-on-Correct's p_err needs. A call the service could not answer after
    the client's retries is recorded as sandbox_error rather than failing the whole step.
    """
    if call.error is not None:
        return ToolRecord(turn, "parse_error", format_parse_error(call))
    if call.name != PYTHON_TOOL_NAME:
        text = f"Error when executing tool: unknown tool {call.name!r}; use {PYTHON_TOOL_NAME!r}"
        return ToolRecord(turn, "parse_error", text)
    code, stdin = call.arguments.get("code"), call.arguments.get("input", "")
    if not isinstance(code, str):
        return ToolRecord(turn, "parse_error", "Error when executing tool: 'code' must be a string")
    stdin = "" if stdin is None else stdin
    if not isinstance(stdin, str):
        text = "Error when executing tool: argument 'input' must be a string"
        return ToolRecord(turn, "parse_error", text, code)
    started = time.monotonic()
    try:
        result = await tools.execute(code, stdin=stdin, timeout=settings.tool_timeout_s)
    except InvalidRequestError as exc:
        text = f"Error when executing tool: {exc.detail}"
        return ToolRecord(turn, "parse_error", text, code, latency_s=time.monotonic() - started)
    except SandboxClientError as exc:
        text = f"Tool call failure\nreason: internal_error ({type(exc).__name__})"
        return ToolRecord(turn, "sandbox_error", text, code, latency_s=time.monotonic() - started)
    text = format_tool_response(
        result, style=settings.response_style, max_chars=settings.tool_response_chars
    )
    return ToolRecord(turn, result.status, text, code, result, time.monotonic() - started)


async def run_rollout(
    engine: Engine,
    tools: Executes,
    codec: Codec,
    template: PromptTemplate,
    prompt_ids: Sequence[int],
    settings: RolloutSettings,
    *,
    group: int = 0,
) -> Trajectory:
    """One trajectory: turns from engine, tool calls through tools, until a stop condition."""
    started = time.monotonic()
    trajectory = Trajectory(prompt_ids=list(prompt_ids), engine=engine.name, group=group)
    context = list(prompt_ids)
    turn_texts: list[str] = []
    finish: FinishReason
    while True:
        budget = settings.max_response_tokens - len(trajectory.response_ids)
        if budget < 1:
            finish = "max_tokens"
            break
        params = SamplingParams(
            max_new_tokens=budget,
            temperature=settings.temperature,
            top_p=settings.top_p,
            stop=template.stop_strings(),
            stop_token_ids=settings.stop_token_ids,
        )
        generation = await engine.generate(context, params)
        start = len(trajectory.response_ids)
        _append(trajectory, context, generation.token_ids, generation.logprobs, sampled=True)
        trajectory.turn_spans.append((start, len(trajectory.response_ids)))
        turn_text = codec.decode(generation.token_ids)
        turn_texts.append(turn_text)
        if generation.finish_reason == "length":
            finish = "max_tokens"
            break
        calls = parse_tool_calls(turn_text)
        if not calls:
            finish = "answer" if _has_answer(turn_text) else "no_tool_call"
            break
        if trajectory.num_turns >= settings.max_turns:
            finish = "max_turns"  # nothing would read the call's response
            break
        record = await execute_call(tools, calls[0], trajectory.num_turns, settings)
        close_turn = not _ended_turn(generation, turn_text, template, settings)
        appended = codec.encode(template.tool_turn([record.text], close_turn=close_turn))
        if len(trajectory.response_ids) + len(appended) >= settings.max_response_tokens:
            finish = "max_tokens"  # no room for the response and a token of reply
            break
        trajectory.tool_results.append(record)
        _append(trajectory, context, appended, None, sampled=False)
    trajectory.finish_reason = finish
    trajectory.response_text = codec.decode(trajectory.response_ids)
    trajectory.generated_text = "".join(turn_texts)
    trajectory.generation_s = time.monotonic() - started
    return trajectory


def _append(
    trajectory: Trajectory,
    context: list[int],
    token_ids: Sequence[int],
    logprobs: Sequence[float] | None,
    *,
    sampled: bool,
) -> None:
    trajectory.response_ids.extend(token_ids)
    trajectory.loss_mask.extend([1 if sampled else 0] * len(token_ids))
    if logprobs is None:
        trajectory.logprobs.extend([0.0] * len(token_ids))
    else:
        trajectory.logprobs.extend(logprobs)
    context.extend(token_ids)
