"""The prompt template renders the rStar2-Agent release's ChatML (spec §2.1, §2.3)."""

from __future__ import annotations

import json

import pytest
from rl_transcripts import GENERATION_PROMPT, tool_turn

from rl.rollout.template import PromptTemplate, demonstration, rstar2_template
from trainer_client.tools import python_tool_schema


def test_prompt_is_system_tools_user_and_prefilled_reason() -> None:
    template = rstar2_template([python_tool_schema()])
    prompt = template.prompt("What is 2 + 2?")
    assert prompt.startswith("<|im_start|>system\nA conversation between User and Assistant.")
    assert "<tools>\n" + json.dumps(python_tool_schema()) + "\n</tools>" in prompt
    assert "within <tool_call></tool_call> XML tags" in prompt
    user = (
        "<|im_start|>user\nYou must put your answer inside <answer> </answer> tags, i.e., "
        "<answer> answer here </answer>. And your final answer will be extracted automatically "
        "by the \\boxed{} tag.\nThis is the problem:\nWhat is 2 + 2?<|im_end|>\n"
    )
    assert prompt.endswith(user + GENERATION_PROMPT)


def test_tool_turn_matches_the_transcripts_used_by_the_penalty_tests() -> None:
    template = PromptTemplate()
    assert template.tool_turn(["out"], close_turn=True) == tool_turn("out")
    # A turn that ended with its own <|im_end|> is not closed twice.
    assert template.tool_turn(["out"], close_turn=False) == tool_turn("out").removeprefix(
        "<|im_end|>"
    )


def test_template_without_system_or_tools() -> None:
    template = PromptTemplate(system="", user_prefix="", include_tools=False)
    assert template.prompt("Q") == "<|im_start|>user\nQ<|im_end|>\n" + GENERATION_PROMPT


def test_demonstration_marks_only_the_assistant_text_as_trained() -> None:
    template = PromptTemplate()
    pieces = demonstration(template, ["a<tool_call>x</tool_call>", "b"], ["resp"])
    assert pieces == [
        ("a<tool_call>x</tool_call>", True),
        (tool_turn("resp"), False),
        ("b<|im_end|>", True),
    ]
    with pytest.raises(ValueError, match="tool responses"):
        demonstration(template, ["a", "b"], [])
    with pytest.raises(ValueError, match="must end with"):
        demonstration(template, ["a", "b"], ["resp"])
