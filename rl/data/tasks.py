"""Problems to train on, and the scripted turns the SFT stage imitates.

The demo task is exact arithmetic on multi-digit integers, a product or the remainder of a
product by a modulus: easy with the Python tool, out of reach for a small model on its own
(a guess is right about 1 time in `modulus`). Its demonstrations either call the tool (compute,
read stdout, answer) or answer at once. The remainder keeps the number the model must copy from
the tool's stdout short: a two-layer model learns to copy one or two tokens from a tool response
in a few hundred steps, a seven-digit product takes it far longer (measured; docs/rl.md).
Real problem files are read by `rl.data.datasets`; demonstrations come as JSON lines with
"question" and "turns". Pure: the tool responses of demonstrations are produced later, by
running their calls.
"""

from __future__ import annotations

import json
import random
import re
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
    hidden: str | None = None
    """A substring of the last turn left out of the loss: a direct answer's number, which no
    small model can learn (training on it would only teach guessing, against copying)."""


def tool_call_text(code: str, stdin: str = "") -> str:
    """A tool call as the template expects the model to write it (Hermes JSON)."""
    body = json.dumps({"name": PYTHON_TOOL_NAME, "arguments": {"code": code, "input": stdin}})
    return f"<tool_call>\n{body}\n</tool_call>"


_QUESTION = re.compile(r"What is (\d+) \* (\d+)(?: mod (\d+))?\?")


def arithmetic_problems(
    n: int, *, seed: int, min_digits: int, max_digits: int, modulus: int = 0
) -> list[Problem]:
    """n problems "What is a * b?" (or "What is a * b mod m?" when modulus > 0)."""
    rng = random.Random(seed)
    problems = []
    for _ in range(n):
        a, b = (
            rng.randrange(10 ** (d - 1), 10**d)
            for d in (rng.randint(min_digits, max_digits) for _ in range(2))
        )
        if modulus > 0:
            problems.append(Problem(f"What is {a} * {b} mod {modulus}?", str(a * b % modulus)))
        else:
            problems.append(Problem(f"What is {a} * {b}?", str(a * b)))
    return problems


def arithmetic_code(question: str) -> str:
    """The program that answers an arithmetic question."""
    match = _QUESTION.fullmatch(question)
    if match is None:
        raise ValueError(f"not an arithmetic question: {question!r}")
    a, b, m = match.groups()
    return f"print({a} * {b} % {m})" if m else f"print({a} * {b})"


def arithmetic_demonstration(problem: Problem, *, use_tool: bool) -> Demonstration:
    """The tool path (compute in Python, then answer with its output) or a direct answer."""
    if not use_tool:
        turn = f"I know this one.</reason><answer>\\boxed{{{problem.answer}}}</answer>"
        return Demonstration(problem.question, (turn,), hidden=problem.answer)
    call = tool_call_text(arithmetic_code(problem.question))
    first = f"Let me compute it with Python.</reason>{call}"
    last = f"I have the output.</reason><answer>\\boxed{{{problem.answer}}}</answer>"
    return Demonstration(problem.question, (first, last))


def arithmetic_demonstrations(
    problems: Sequence[Problem], *, tool_fraction: float, seed: int
) -> list[Demonstration]:
    """One demonstration per problem; a tool_fraction share of them uses the tool."""
    rng = random.Random(seed)
    return [arithmetic_demonstration(p, use_tool=rng.random() < tool_fraction) for p in problems]


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
