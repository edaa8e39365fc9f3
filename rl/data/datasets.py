"""Problems from JSON lines or parquet, with the columns named by the config.

DAPO-Math-17k (the release's training set) is parquet with the question inside a chat list,
`prompt[-1].content` of the user turn, and the answer at `reward_model.ground_truth`; a column
path is dotted (`reward_model.ground_truth`), and a list of chat messages is read as its last
user message. The paper trains on integer answers only (§4.1: they verify reliably), and prompts
longer than the budget are dropped, as the release's data filter does. Pure apart from reading
the file; pyarrow is imported only for parquet.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl.data.tasks import Problem

_INTEGER = re.compile(r"[+-]?\d+")


@dataclass(frozen=True, slots=True)
class Columns:
    """Where the question and the answer are in a row."""

    question: str = "question"
    """Dotted path of the question (a string, or a list of chat messages)."""
    answer: str = "answer"
    """Dotted path of the ground-truth answer."""


DAPO_MATH = Columns(question="prompt", answer="reward_model.ground_truth")
"""The layout of DAPO-Math-17k (and of verl's math parquet files)."""


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What a load kept and dropped, and why."""

    rows: int
    kept: int
    not_integer: int
    too_long: int


def field_at(row: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted path (`reward_model.ground_truth`); KeyError names the path."""
    value: Any = row
    for part in path.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list | tuple) and part.lstrip("-").isdigit():
            value = value[int(part)]
        else:
            raise KeyError(path)
    return value


def question_text(value: Any) -> str:
    """A question column as text: a string, or a chat list's last user message."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        users = [m for m in value if isinstance(m, Mapping) and m.get("role") == "user"]
        if users and isinstance(users[-1].get("content"), str):
            return str(users[-1]["content"])
    raise TypeError(f"a question must be a string or a list of chat messages, got {value!r:.80}")


def answer_text(value: Any) -> str:
    """An answer column as text (numbers as written; a one-element list as its element)."""
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise TypeError(f"an answer must be a string or a number, got {value!r:.80}")
    return str(value).strip()


def is_integer_answer(answer: str) -> bool:
    """Whether the answer is a plain integer ("42", "-7"), as the paper keeps."""
    return _INTEGER.fullmatch(answer.replace(",", "")) is not None


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: expected an object")
        yield f"{path}:{number}", row


def _parquet_rows(path: Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    import pyarrow.parquet as pq  # type: ignore[import-untyped,unused-ignore]

    table = pq.read_table(path)
    for number, row in enumerate(table.to_pylist()):
        yield f"{path}:row {number}", row


def read_rows(path: str | Path, file_format: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(where, row) of a JSON-lines ("jsonl") or parquet ("parquet") file."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if file_format == "parquet":
        return _parquet_rows(path)
    if file_format == "jsonl":
        return _jsonl_rows(path)
    raise ValueError(f"unknown problem file format {file_format!r} (jsonl or parquet)")


def load_problem_file(
    path: str | Path,
    file_format: str,
    columns: Columns = Columns(),
    *,
    integer_answers_only: bool = False,
    max_prompt_tokens: int = 0,
    count_tokens: Callable[[str], int] | None = None,
) -> tuple[list[Problem], LoadReport]:
    """Problems of a file, less non-integer answers and over-long prompts when asked.

    max_prompt_tokens: drop a problem whose question is longer (by count_tokens, which must
    then be given: the rendered prompt's token count); 0 keeps every length.
    """
    if max_prompt_tokens and count_tokens is None:
        raise ValueError("max_prompt_tokens needs count_tokens")
    problems: list[Problem] = []
    rows = not_integer = too_long = 0
    for where, row in read_rows(path, file_format):
        rows += 1
        try:
            question = question_text(field_at(row, columns.question))
            answer = answer_text(field_at(row, columns.answer))
        except KeyError as exc:
            raise ValueError(f"{where}: no column {exc.args[0]!r}") from None
        except TypeError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if integer_answers_only and not is_integer_answer(answer):
            not_integer += 1
            continue
        if max_prompt_tokens and count_tokens and count_tokens(question) > max_prompt_tokens:
            too_long += 1
            continue
        problems.append(
            Problem(question, answer.replace(",", "") if integer_answers_only else answer)
        )
    if not problems:
        raise ValueError(f"{path}: no problems left ({rows} rows read)")
    return problems, LoadReport(rows, len(problems), not_integer, too_long)
