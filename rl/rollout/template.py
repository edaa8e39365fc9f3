"""The rStar2-Agent chat template (ChatML, as Qwen renders it), as plain strings.

A prompt is a system turn (the `<reason>`/`<answer>` instruction, then the Hermes tools block),
a user turn (a fixed prefix, then the question) and the generation prompt
`<|im_start|>assistant\\n<reason>`: the assistant turn is pre-filled with `<reason>` (release).
After a turn that ends in a tool call the rollout loop appends, unsampled and masked out of the
loss: the end of that turn, the tool response as a user turn, and the next pre-filled assistant
header (spec §2.3):

    ...</tool_call><|im_end|>\\n<|im_start|>user\\n<tool_response>\\n{text}\\n</tool_response>
    <|im_end|>\\n<|im_start|>assistant\\n<reason>

Every piece is a field of `PromptTemplate`, so a model with another chat format, or a demo that
cannot afford the long system prompt, changes only values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

RSTAR2_SYSTEM = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant "
    "solves it. The Assistant first thinks about the reasoning process in the mind and then "
    "provides the User with the answer. The reasoning process is enclosed within <reason> "
    "</reason> and answer is enclosed within <answer> </answer> tags, respectively, i.e., "
    "<reason> reasoning process here </reason> <answer> answer here </answer>."
)
RSTAR2_USER_PREFIX = (
    "You must put your answer inside <answer> </answer> tags, i.e., <answer> answer here "
    "</answer>. And your final answer will be extracted automatically by the \\boxed{} tag.\n"
    "This is the problem:\n"
)
TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TOOL_CALL_END = "</tool_call>"


@dataclass(frozen=True, slots=True)
class PromptTemplate:
    """Every string the rollout loop puts around the model's turns."""

    system: str = RSTAR2_SYSTEM
    """The system instruction; empty for no system turn."""
    user_prefix: str = RSTAR2_USER_PREFIX
    """Put before every question in the user turn."""
    include_tools: bool = True
    """Append the Hermes tools block (the tool's JSON schema) to the system turn."""
    assistant_prefill: str = "<reason>"
    """Opens every assistant turn, in the prompt (not sampled, not trained)."""
    turn_end: str = IM_END
    """Ends a turn; the model samples it at the end of its own turns (end of turn = stop)."""
    tool_call_end: str = TOOL_CALL_END
    """Generation of a turn stops here too, so the call is sent at once."""
    tools: tuple[str, ...] = field(default_factory=tuple)
    """JSON schemas (one string each) listed in the tools block."""

    def system_text(self) -> str:
        """The system turn's content: the instruction, then the tools block if asked for."""
        text = self.system
        if self.include_tools and self.tools:
            block = TOOLS_HEADER + "\n".join(self.tools) + TOOLS_FOOTER
            text = f"{text}\n\n{block}" if text else block
        return text

    def prompt(self, question: str) -> str:
        """The whole prompt for one question, ending in the pre-filled assistant header."""
        parts = []
        system = self.system_text()
        if system:
            parts.append(f"{IM_START}system\n{system}{self.turn_end}\n")
        parts.append(f"{IM_START}user\n{self.user_prefix}{question}{self.turn_end}\n")
        parts.append(self.generation_prompt())
        return "".join(parts)

    def generation_prompt(self) -> str:
        """The header that opens an assistant turn, pre-fill included."""
        return f"{IM_START}assistant\n{self.assistant_prefill}"

    def tool_turn(self, responses: Sequence[str], *, close_turn: bool) -> str:
        """What follows a turn with tool calls: its end (unless sampled), the responses, a new turn.

        close_turn: the model's turn stopped on `</tool_call>`, so its end-of-turn is added here.
        """
        blocks = "\n".join(f"<tool_response>\n{text}\n</tool_response>" for text in responses)
        head = f"{self.turn_end}\n" if close_turn else "\n"
        return f"{head}{IM_START}user\n{blocks}{self.turn_end}\n{self.generation_prompt()}"

    def stop_strings(self) -> tuple[str, ...]:
        """Where the generation of one turn stops: the end of a tool call, the end of the turn."""
        return (self.tool_call_end, self.turn_end)


def rstar2_template(tool_schemas: Sequence[dict[str, Any]]) -> PromptTemplate:
    """The release's template with the given tools (e.g. trainer_client's python_tool_schema())."""
    return PromptTemplate(tools=tuple(json.dumps(s, ensure_ascii=False) for s in tool_schemas))


def demonstration(
    template: PromptTemplate, turns: Sequence[str], tool_responses: Sequence[str]
) -> list[tuple[str, bool]]:
    """A scripted response as (text, trained) pieces, rendered exactly as a rollout renders it.

    turns: the assistant turns' text after the pre-fill; each but the last ends in a tool call
    (`</tool_call>`), the last is closed with the end-of-turn token, which is trained.
    tool_responses: one per turn but the last.
    """
    if len(tool_responses) != len(turns) - 1:
        raise ValueError(f"{len(turns)} turns need {len(turns) - 1} tool responses")
    pieces: list[tuple[str, bool]] = []
    for i, turn in enumerate(turns):
        if i < len(tool_responses):
            if not turn.endswith(template.tool_call_end):
                raise ValueError(f"turn {i} must end with {template.tool_call_end!r}")
            pieces.append((turn, True))
            pieces.append((template.tool_turn([tool_responses[i]], close_turn=True), False))
        else:
            pieces.append((turn + template.turn_end, True))
    return pieces
