"""A cell's error as IPython's kernel reports it to E2B's server (pure).

E2B's template runs IPython 9 with `colors = "NoColor"`, and its server joins the kernel's
traceback items with "" (`template/server/messaging.py`). The items are a rule, the exception's
name with "Traceback (most recent call last)", one item per frame (`Cell In[<n>], line <l>`,
the source around the line, the line marked with an arrow) and the last line of the exception.
The jail gives Python's traceback of the cell's frames (`File "<cell>", line 2, in f`); the
sources are the cell's and the context's last ones before it (e2b_store.py keeps them), so a
frame is rendered with its lines when it is of one of them: the module's own frame is this
cell's, a function's is the latest cell that defines it around that line. A library's frame is
named with the line Python printed (the API reads no file a traceback names: a program chooses
its frames' file names).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass

RULE = "-" * 75
HEADER_WIDTH = 42
CONTEXT_PIECES = 2
"""Pieces (statements, comments) shown before and after the failing one, as IPython shows."""
_FRAME = re.compile(r'  File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<name>.+)\n')
CELL_FILE = "<cell>"


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of Python's traceback: file, line, function, and the source line if shown."""

    file: str
    line: int
    name: str
    source: str | None


def frames_of(traceback_lines: list[str]) -> list[Frame]:
    """The frames of `traceback.format_exception`'s lines (each item one frame, or more)."""
    text = "".join(traceback_lines)
    frames: list[Frame] = []
    matches = list(_FRAME.finditer(text))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(text)
        body = text[match.end() : end].splitlines()
        source = body[0].strip() if body and body[0].startswith("    ") else None
        frames.append(Frame(match["file"], int(match["line"]), match["name"], source))
    return frames


def _line_prefix(number: int, arrow: bool) -> str:
    digits = str(number)
    if arrow:
        return "-" * max(5 - len(digits), 1) + "> " + digits
    return digits.rjust(7)


def _function_at(tree: ast.Module, name: str, line: int) -> tuple[ast.FunctionDef, str] | None:
    """The innermost function named `name` whose body holds `line`, and its qualified name
    (`A.m`, `f.<locals>.g`), as IPython names a frame."""
    found: tuple[ast.FunctionDef, str] | None = None

    def visit(node: ast.AST, prefix: str) -> None:
        nonlocal found
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                qualname = prefix + child.name
                if child.name == name and child.body[0].lineno <= line <= (child.end_lineno or 0):
                    found = (child, qualname)  # type: ignore[assignment]
                visit(child, qualname + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def _signature(function: ast.FunctionDef, qualname: str) -> str:
    arguments = function.args
    names = [a.arg for a in (*arguments.posonlyargs, *arguments.args)]
    if arguments.vararg is not None:
        names.append("*" + arguments.vararg.arg)
    names.extend(a.arg for a in arguments.kwonlyargs)
    if arguments.kwarg is not None:
        names.append("**" + arguments.kwarg.arg)
    return f"{qualname}({', '.join(names)})"


def _pieces(tree: ast.Module, lines: list[str], first: int, last: int) -> list[range]:
    """Line ranges (1-based) of the pieces between `first` and `last`: a simple statement's
    lines, a compound statement's header, a comment line; blank lines belong to none."""
    starts: dict[int, int] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt):
            continue
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            end = body[0].lineno - 1
            decorators = getattr(node, "decorator_list", [])
            start = min([node.lineno, *(d.lineno for d in decorators)])
        else:
            start, end = node.lineno, node.end_lineno or node.lineno
        starts[start] = max(starts.get(start, start), min(end, len(lines)))
    pieces: list[range] = []
    number = first
    while number <= last:
        if number in starts:
            end = max(starts[number], number)
            while end > number and not lines[end - 1].strip():
                end -= 1
            pieces.append(range(number, min(end, last) + 1))
            number = end + 1
        else:
            if lines[number - 1].strip():
                pieces.append(range(number, number + 1))
            number += 1
    return pieces


def _context(tree: ast.Module, lines: list[str], line: int, scope: range) -> str:
    """The pieces around `line` within `scope`, dedented by their common indentation."""
    pieces = _pieces(tree, lines, scope.start, scope.stop - 1)
    at = next((i for i, piece in enumerate(pieces) if line in piece), None)
    if at is None:
        return ""
    shown = pieces[max(at - CONTEXT_PIECES, 0) : at + CONTEXT_PIECES + 1]
    numbers = [number for piece in shown for number in piece]
    indent = min(len(lines[n - 1]) - len(lines[n - 1].lstrip()) for n in numbers)
    out = [f"{_line_prefix(n, n == line)} {lines[n - 1][indent:].rstrip()}\n" for n in numbers]
    return "".join(out)


@dataclass(frozen=True, slots=True)
class CellSource:
    """A cell whose frames may be in a traceback: its execution count, lines and tree."""

    count: int
    lines: list[str]
    tree: ast.Module | None

    @classmethod
    def of(cls, count: int, source: str) -> CellSource:
        try:
            tree: ast.Module | None = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            tree = None
        return cls(count, source.splitlines(), tree)


def _function_item(frame: Frame, cell: CellSource) -> str | None:
    """A function frame rendered from `cell`, if `cell` defines that function at that line."""
    if cell.tree is None or not 1 <= frame.line <= len(cell.lines):
        return None
    found = _function_at(cell.tree, frame.name, frame.line)
    if found is None:
        return None
    function, qualname = found
    scope = range(function.lineno, (function.end_lineno or function.lineno) + 1)
    context = _context(cell.tree, cell.lines, frame.line, scope)
    return (
        f"Cell In[{cell.count}], line {frame.line}, in {_signature(function, qualname)}\n{context}"
    )


def _frame_item(frame: Frame, cell: CellSource, earlier: Sequence[tuple[int, str]]) -> str:
    if frame.file != CELL_FILE:
        shown = f"File {frame.file}:{frame.line}, in {frame.name}\n"
        if frame.source is not None:
            shown += f"{_line_prefix(frame.line, True)} {frame.source}\n"
        return shown
    if frame.name == "<module>":
        where = f"Cell In[{cell.count}], line {frame.line}\n"
        if cell.tree is None or not 1 <= frame.line <= len(cell.lines):
            return where
        return where + _context(cell.tree, cell.lines, frame.line, range(1, len(cell.lines) + 1))
    item = _function_item(frame, cell)
    for count, source in earlier:  # a function an earlier cell defined, latest first
        if item is not None:
            break
        item = _function_item(frame, CellSource.of(count, source))
    return item or f"Cell In[?], line {frame.line}, in {frame.name}()\n"


def ipython_traceback(
    ename: str,
    evalue: str,
    traceback_lines: list[str],
    source: str,
    count: int,
    earlier: Sequence[tuple[int, str]] = (),
) -> str:
    """The `traceback` E2B gives for a cell's error: IPython's items, joined with ""
    (`earlier`: the context's earlier cells, latest first, for the functions they defined)."""
    cell = CellSource.of(count, source)
    last = f"{ename}: {evalue}" if evalue else ename
    if ename in ("SyntaxError", "IndentationError", "TabError"):
        # IPython shows where the cell failed to compile, not the frames that compiled it.
        body = "".join(traceback_lines)
        at = body.rfind('  File "<cell>", line ')
        body = body[at:] if at >= 0 else "".join(traceback_lines[-1:])
        body = re.sub(
            r'File "<cell>", line (\d+)', lambda m: f"Cell In[{count}], line {m[1]}", body
        )
        return body.rstrip("\n")
    items = [RULE, f"{ename.ljust(HEADER_WIDTH - 1)} Traceback (most recent call last)"]
    items.extend(_frame_item(f, cell, earlier) for f in frames_of(traceback_lines))
    items.append(last)
    return "".join(items)
