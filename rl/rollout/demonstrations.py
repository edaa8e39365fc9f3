"""Demonstrations rendered exactly as rollouts are, for the SFT stage (rl.sft).

The assistant's turns are trained (mask 1), and the tool responses between them are the real
responses of the sandbox to the demonstration's own calls (mask 0).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rl.data.tasks import Demonstration
from rl.rollout.loop import Codec, RolloutSettings, execute_call
from rl.rollout.template import PromptTemplate, demonstration
from rl.sft import SFTExample
from trainer_client.tools import Executes, parse_tool_calls


async def _render_one(
    demo: Demonstration,
    template: PromptTemplate,
    codec: Codec,
    tools: Executes,
    settings: RolloutSettings,
) -> SFTExample:
    responses = []
    for number, turn in enumerate(demo.turns[:-1], 1):
        calls = parse_tool_calls(turn)
        if not calls:
            raise ValueError(f"demonstration turn {number} has no tool call: {turn[:80]!r}")
        record = await execute_call(tools, calls[0], number, settings)
        responses.append(record.text)
    pieces = demonstration(template, list(demo.turns), responses)
    if demo.hidden:
        text, _ = pieces[-1]
        at = text.rindex(demo.hidden)
        end = at + len(demo.hidden)
        pieces[-1:] = [(text[:at], True), (text[at:end], False), (text[end:], True)]
    response: list[int] = []
    mask: list[int] = []
    for text, trained in pieces:
        ids = codec.encode(text)
        response.extend(ids)
        mask.extend([int(trained)] * len(ids))
    return SFTExample(codec.encode(template.prompt(demo.question)), response, mask)


async def render_demonstrations(
    demos: Sequence[Demonstration],
    template: PromptTemplate,
    codec: Codec,
    tools: Executes,
    settings: RolloutSettings,
) -> list[SFTExample]:
    """Tokenize demonstrations, running their tool calls in the sandbox (all concurrently)."""
    return list(
        await asyncio.gather(*(_render_one(d, template, codec, tools, settings) for d in demos))
    )
