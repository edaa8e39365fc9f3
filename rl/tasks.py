"""Problems to train on, and the scripted turns the SFT stage imitates.

The demo task is exact multiplication of multi-digit integers: easy with the Python tool, out of
reach for a small model on its own. Its demonstrations either call the tool (compute, read
stdout, answer) or answer at once. Real datasets come as JSON lines with "question" and "answer".
Pure: the tool responses of demonstrations are produced later, by running their calls.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer_client.tools import PYTHON_TOOL_NAME


@dataclass(frozen=True, slots=True)
class Problem:
    """One question with its ground-truth answer."""

    question: str
    answer: str


@dataclass(frozen=True, slots=True)
class Demonstration:
    """An SFT example: the question and the assistant's turns (all but the last call a tool)."""

    question: str
    turns: tuple[str, ...]


def tool_call_text(code: str, stdin: str = "") -> str:
    """A tool call as the template expects the model to write it (Hermes JSON)."""
    body = json.dumps({"name": PYTHON_TOOL_NAME, "arguments": {"code": code, "input": stdin}})
    return f"<tool_call>\n{body}\n</tool_call>"


def arithmetic_problems(n: int, *, seed: int, min_digits: int, max_digits: int) -> list[Problem]:
    """n multiplication problems a * b with operands of min..max digits."""
    rng = random.Random(seed)
    problems = []
    for _ in range(n):
        a, b = (
            rng.randrange(10 ** (d - 1), 10**d)
            for d in (rng.randint(min_digits, max_digits) for _ in range(2))
        )
        problems.append(Problem(f"What is {a} * {b}?", str(a * b)))
    return problems


def _operands(question: str) -> tuple[int, int]:
    left, right = question.removeprefix("What is ").removesuffix("?").split(" * ")
    return int(left), int(right)


def arithmetic_demonstration(problem: Problem, *, use_tool: bool) -> Demonstration:
    """The tool path (compute in Python, then answer with its output) or a direct answer."""
    a, b = _operands(problem.question)
    if not use_tool:
        turn = f"I know this one.</reason><answer>\\boxed{{{problem.answer}}}</answer>"
        return Demonstration(problem.question, (turn,))
    call = tool_call_text(f"print({a} * {b})")
    first = f"Let me compute it with Python.</reason>{call}"
    last = f"The output is {problem.answer}.</reason><answer>\\boxed{{{problem.answer}}}</answer>"
    return Demonstration(problem.question, (first, last))


def arithmetic_demonstrations(
    problems: Sequence[Problem], *, tool_fraction: float, seed: int
) -> list[Demonstration]:
    """One demonstration per problem; a tool_fraction share of them uses the tool."""
    rng = random.Random(seed)
    return [arithmetic_demonstration(p, use_tool=rng.random() < tool_fraction) for p in problems]


def load_problems(path: str | Path) -> list[Problem]:
    """JSON lines with "question" and "answer" (an answer may be a number)."""
    problems = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            problems.append(Problem(str(row["question"]), str(row["answer"])))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: need an object with question and answer") from exc
    if not problems:
        raise ValueError(f"{path}: no problems")
    return problems


def load_demonstrations(path: str | Path) -> list[Demonstration]:
    """JSON lines with "question" and "turns" (a list of assistant turns)."""
    demos = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = tuple(str(t) for t in row["turns"])
            demos.append(Demonstration(str(row["question"]), turns))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: need an object with question and turns") from exc
        if not turns:
            raise ValueError(f"{path}:{number}: empty turns")
    return demos
