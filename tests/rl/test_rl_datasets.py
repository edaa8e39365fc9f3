"""Problem files: JSON lines and parquet, column paths, DAPO-Math-17k's layout, filters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl.data.datasets import (
    DAPO_MATH,
    Columns,
    field_at,
    is_integer_answer,
    load_problem_file,
    question_text,
)


def dapo_row(question: str, answer: str) -> dict[str, object]:
    """A row as DAPO-Math-17k (and verl's math parquet) lay it out."""
    return {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": question}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": "x"},
    }


ROWS = [
    dapo_row("What is 2 + 2?", "4"),
    dapo_row("Simplify sqrt(8).", "2\\sqrt{2}"),
    dapo_row("How many primes are below 100?", "25"),
    dapo_row("Write 1000 with a separator.", "1,000"),
    dapo_row("What is 3 - 10?", "-7"),
]


def write_parquet(path: Path, rows: list[dict[str, object]]) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_dapo_math_parquet_with_the_papers_integer_filter(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "dapo.parquet", ROWS)
    problems, report = load_problem_file(path, "parquet", DAPO_MATH, integer_answers_only=True)
    assert [(p.question, p.answer) for p in problems] == [
        ("What is 2 + 2?", "4"),
        ("How many primes are below 100?", "25"),
        ("Write 1000 with a separator.", "1000"),
        ("What is 3 - 10?", "-7"),
    ]
    assert (report.rows, report.kept, report.not_integer, report.too_long) == (5, 4, 1, 0)


def test_json_lines_with_mapped_columns_and_all_answers(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [
        {"problem": {"text": "Q1"}, "solution": 12},
        {},
        {"problem": {"text": "Q2"}, "solution": "x^2"},
    ]
    path.write_text("\n".join(json.dumps(r) if r else "" for r in rows) + "\n")
    problems, report = load_problem_file(path, "jsonl", Columns("problem.text", "solution"))
    assert [(p.question, p.answer) for p in problems] == [("Q1", "12"), ("Q2", "x^2")]
    assert report.kept == 2


def test_prompt_length_cap_drops_long_prompts(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        "".join(json.dumps({"question": q, "answer": "1"}) + "\n" for q in ["a b", "a b c d e f"])
    )
    problems, report = load_problem_file(
        path, "jsonl", max_prompt_tokens=3, count_tokens=lambda q: len(q.split())
    )
    assert [p.question for p in problems] == ["a b"] and report.too_long == 1
    with pytest.raises(ValueError, match="count_tokens"):
        load_problem_file(path, "jsonl", max_prompt_tokens=3)


def test_errors_name_the_row_and_the_column(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"question": "Q"}) + "\n")
    with pytest.raises(ValueError, match=r"p.jsonl:1: no column 'answer'"):
        load_problem_file(path, "jsonl")
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"p.jsonl:1: not JSON"):
        load_problem_file(path, "jsonl")
    with pytest.raises(ValueError, match="no such file"):
        load_problem_file(tmp_path / "missing.parquet", "parquet")
    path.write_text(json.dumps({"question": "Q", "answer": "x"}) + "\n")
    with pytest.raises(ValueError, match="no problems left"):
        load_problem_file(path, "jsonl", integer_answers_only=True)


def test_column_paths_and_chat_questions() -> None:
    row = {"a": {"b": [{"c": 1}, {"c": 2}]}}
    assert field_at(row, "a.b.1.c") == 2
    with pytest.raises(KeyError):
        field_at(row, "a.x")
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "..."},
        {"role": "user", "content": "second"},
    ]
    assert question_text(chat) == "second"
    with pytest.raises(TypeError):
        question_text([{"role": "system", "content": "no user turn"}])


@pytest.mark.parametrize(
    ("answer", "integer"),
    [
        ("42", True),
        ("-7", True),
        ("+3", True),
        ("1,000", True),
        ("3.5", False),
        ("\\frac{1}{2}", False),
        ("", False),
        ("4 or 5", False),
    ],
)
def test_integer_answers(answer: str, integer: bool) -> None:
    assert is_integer_answer(answer) is integer
