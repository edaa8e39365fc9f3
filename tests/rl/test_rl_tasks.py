"""The demo task and the JSON-lines loaders."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from rl.data.datasets import load_problem_file
from rl.data.tasks import (
    arithmetic_code,
    arithmetic_demonstration,
    arithmetic_problems,
    load_demonstrations,
)
from rl.rollout.demonstrations import render_demonstrations
from rl.rollout.loop import RolloutSettings
from rl.rollout.template import PromptTemplate
from rl.sft import SFTExample
from trainer_client.tools import parse_tool_calls
from trainer_client.wire import ExecuteResult


def test_problems_are_exact_and_their_programs_compute_them() -> None:
    for modulus in (0, 97):
        for p in arithmetic_problems(50, seed=3, min_digits=3, max_digits=4, modulus=modulus):
            code = arithmetic_code(p.question)
            assert code.startswith("print(")
            assert str(eval(code.removeprefix("print(").removesuffix(")"))) == p.answer
    assert arithmetic_problems(5, seed=1, min_digits=2, max_digits=2) == arithmetic_problems(
        5, seed=1, min_digits=2, max_digits=2
    )


def test_tool_demonstration_calls_the_python_tool_then_answers() -> None:
    (problem,) = arithmetic_problems(1, seed=0, min_digits=3, max_digits=3, modulus=97)
    first, last = arithmetic_demonstration(problem, use_tool=True).turns
    (call,) = parse_tool_calls(first, strict_json=True)
    assert call.ok and call.arguments == {"code": arithmetic_code(problem.question), "input": ""}
    assert last.endswith(f"<answer>\\boxed{{{problem.answer}}}</answer>")
    (direct,) = arithmetic_demonstration(problem, use_tool=False).turns
    assert "<tool_call>" not in direct


def test_loaders_name_the_bad_line(tmp_path: Path) -> None:
    good = tmp_path / "p.jsonl"
    good.write_text(json.dumps({"question": "1+1?", "answer": 2}) + "\n\n")
    assert load_problem_file(good, "jsonl")[0][0].answer == "2"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_problem_file(bad, "jsonl")
    demos = tmp_path / "d.jsonl"
    demos.write_text(json.dumps({"question": "q", "turns": ["a"]}) + "\n")
    assert load_demonstrations(demos)[0].turns == ("a",)
    demos.write_text(json.dumps({"question": "q", "turns": []}) + "\n")
    with pytest.raises(ValueError, match="empty turns"):
        load_demonstrations(demos)


class Chars:
    """One token per character: masks can be read off the text."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(map(chr, ids))


class Prints:
    async def execute(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout: float = 10.0,  # noqa: ASYNC109 -- the program's limit (client API)
    ) -> ExecuteResult:
        return ExecuteResult(id="1", status="ok", stdout="17\n")


async def test_sft_trains_the_turns_not_the_tool_response_nor_a_guessed_number() -> None:
    (problem,) = arithmetic_problems(1, seed=0, min_digits=3, max_digits=3, modulus=97)
    demos = [arithmetic_demonstration(problem, use_tool=u) for u in (True, False)]
    template = PromptTemplate(system="", user_prefix="", include_tools=False)
    tool, direct = await render_demonstrations(
        demos, template, Chars(), Prints(), RolloutSettings()
    )

    def trained(example: SFTExample) -> str:
        return "".join(
            chr(t) for t, m in zip(example.response_ids, example.loss_mask, strict=True) if m
        )

    assert trained(tool) == "".join(demos[0].turns) + "<|im_end|>"
    assert "stdout: 17" in Chars().decode(tool.response_ids)
    assert trained(direct) == "I know this one.</reason><answer>\\boxed{}</answer><|im_end|>"
