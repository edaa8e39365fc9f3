"""The pure parts of notebook cells: which cells are notebook syntax, pip's answers from the
installed distributions, IPython's time format, a value's rich representations."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from sandbox_service.jail.inside import cell_syntax, pip_answer
from sandbox_service.jail.inside.formatters import mime_bundle
from sandbox_service.jail.inside.magics import format_time


@pytest.mark.parametrize(
    "cell",
    [
        "!ls",
        "  !ls",
        "%time x = 1",
        "%%writefile a.txt\nx",
        "x = !ls",
        "d['k'] = !ls",
        "a\n%pip install x",
    ],
)
def test_notebook_lines_are_recognised(cell: str) -> None:
    assert cell_syntax.has_notebook_syntax(cell)


@pytest.mark.parametrize(
    "cell", ["x = 1 % 2", "a != b", "print('!')", "s = '%d' % 3", "# !comment", "if not x: pass"]
)
def test_python_lines_are_not_notebook_syntax(cell: str) -> None:
    assert not cell_syntax.has_notebook_syntax(cell)
    assert cell_syntax.notebook_source(cell) is cell


def test_the_transformer_writes_get_ipython_calls() -> None:
    source = cell_syntax.notebook_source("!echo hi\nfiles = !ls\n%time y = 1\n")
    assert source.splitlines() == [
        "get_ipython().system('echo hi')",
        "files = get_ipython().getoutput('ls')",
        "get_ipython().run_line_magic('time', 'y = 1')",
    ]


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("pip install numpy", ["install", "numpy"]),
        ("pip3 install -q numpy", ["install", "-q", "numpy"]),
        ("python -m pip install x", ["install", "x"]),
        ("/usr/bin/python3.12 -m pip list", ["list"]),
        ("pip install x && rm -rf /tmp/y", None),
        ("ls pip", None),
        ("pip install 'unbalanced", None),
    ],
)
def test_pip_commands(command: str, words: list[str] | None) -> None:
    assert pip_answer.pip_words(command) == words


def test_installed_requirements_are_already_satisfied() -> None:
    answer = pip_answer.answer(["install", "-q", "--upgrade", "numpy", "Pillow", "sympy>=1.0"])
    assert answer.status == 0 and answer.stderr == ""
    lines = answer.stdout.splitlines()
    assert [line.split(" in ")[0] for line in lines] == [
        "Requirement already satisfied: numpy",
        "Requirement already satisfied: Pillow",
        "Requirement already satisfied: sympy>=1.0",
    ]
    assert all(line.endswith(")") and "site-packages" in line for line in lines)


@pytest.mark.parametrize(
    "args",
    [
        ["install", "numpy", "surely-not-installed-xyz"],
        ["install", "numpy>=999"],
        ["install", "-r", "requirements.txt"],
        ["install", "-e", "."],
        ["install"],
        ["uninstall", "numpy"],
        [],
    ],
)
def test_anything_else_fails_saying_why(args: list[str]) -> None:
    answer = pip_answer.answer(args)
    assert answer.status == 1 and answer.stdout == ""
    assert "ERROR" in answer.stderr or "Usage" in answer.stderr


def test_pip_list_and_freeze_list_the_image() -> None:
    assert "numpy==" in pip_answer.answer(["freeze"]).stdout
    assert pip_answer.answer(["list"]).stdout.startswith("Package")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(1.5, "1.5 s"), (0.0012, "1.2 ms"), (2e-6, "2 \xb5s"), (3.5e-8, "35 ns"), (0.0, "0 ns")],
)
def test_time_is_formatted_as_ipython_does(seconds: float, text: str) -> None:
    assert format_time(seconds) == text


class Rich:
    def _repr_html_(self) -> str:
        return "<i>r</i>"

    def _repr_png_(self) -> bytes:
        return b"\x89PNG\r\n\x1a\n"

    def _repr_json_(self) -> tuple[dict[str, int], dict[str, Any]]:
        return {"r": 1}, {"expanded": True}

    def _repr_latex_(self) -> None:
        return None


class Bundled:
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {"text/markdown": "*b*", "application/x-other": "dropped"}


class AnswersEverything:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: "anything"


def test_rich_representations_are_gathered() -> None:
    bundle = mime_bundle(Rich(), "Rich()")
    assert bundle["text/plain"] == "Rich()" and bundle["text/html"] == "<i>r</i>"
    assert base64.b64decode(bundle["image/png"]) == b"\x89PNG\r\n\x1a\n"
    assert json.loads(bundle["application/json"]) == {"r": 1}
    assert "text/latex" not in bundle
    assert mime_bundle(Bundled(), "b") == {"text/plain": "b", "text/markdown": "*b*"}
    # Only methods of the value's class count, as in IPython: not an instance's __getattr__.
    assert mime_bundle(AnswersEverything(), "a") == {"text/plain": "a"}
    assert mime_bundle(Rich, "<class>") == {"text/plain": "<class>"}
