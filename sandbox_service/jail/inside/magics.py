"""The line and cell magics a cell may use, as IPython's behave: `%time`, `%%time`, `%timeit`,
`%%timeit`, `%%writefile`, `%cd`, `%env`, `%pip`, `%%bash`/`%%sh`, `%matplotlib` (figures are
always displayed: accepted and ignored). Each takes the shell (shell.CellShell) it runs for.
"""

from __future__ import annotations

import ast
import math
import os
import shlex
import sys
import time
import timeit
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from .shell import CellShell


class UsageError(Exception):
    """A magic used wrongly, or one that does not exist (IPython's UsageError)."""


def format_time(seconds: float, precision: int = 3) -> str:
    """A duration as IPython's magics print it (s, ms, µs, ns)."""
    if seconds >= 60.0:
        minutes, rest = divmod(seconds, 60.0)
        hours, minutes = divmod(minutes, 60.0)
        parts = [(hours, "h"), (minutes, "min"), (rest, "s")]
        return " ".join(f"{value:.0f}{unit}" for value, unit in parts if value)
    units = ["s", "ms", "\xb5s", "ns"]
    order = min(-int(math.floor(math.log10(seconds)) // 3), 3) if seconds > 0.0 else 3
    return f"{seconds * 1000**order:.{precision}g} {units[order]}"


def _run_timed(shell: CellShell, code: str) -> Any:
    """Run `code` in the cell's namespace; the value of a last expression (None otherwise)."""
    tree = ast.parse(code, "<timed>", "exec")
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, "<timed>", "exec"), shell.user_ns)
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), "<timed>", "eval"), shell.user_ns)


def _time(shell: CellShell, line: str, cell: str | None = None) -> Any:
    code = shell.transform(cell) if cell is not None else line
    cpu_before, wall_before = os.times(), time.perf_counter()
    try:
        return _run_timed(shell, code)
    finally:
        cpu_after, wall = os.times(), time.perf_counter() - wall_before
        user = cpu_after.user - cpu_before.user
        system = cpu_after.system - cpu_before.system
        print(
            f"CPU times: user {format_time(user)}, sys: {format_time(system)}, "
            f"total: {format_time(user + system)}\nWall time: {format_time(wall)}"
        )


def _timeit(shell: CellShell, line: str, cell: str | None = None) -> Any:
    number, repeat, quiet, keep = 0, 7, False, False
    options, statement = _timeit_options(line)
    for flag, value in options:
        if flag == "-n":
            number = int(value)
        elif flag == "-r":
            repeat = int(value)
        elif flag == "-q":
            quiet = True
        elif flag == "-o":
            keep = True
    setup = "pass"
    if cell is not None:
        setup, statement = statement or "pass", shell.transform(cell)
    if not statement.strip():
        raise UsageError("%timeit needs a statement to time")
    timer = timeit.Timer(statement, setup, globals=shell.user_ns)
    if number == 0:
        number = timer.autorange()[0]
    runs = [total / number for total in timer.repeat(repeat, number)]
    mean = sum(runs) / len(runs)
    spread = math.sqrt(sum((r - mean) ** 2 for r in runs) / len(runs))
    if not quiet:
        print(
            f"{format_time(mean)} \xb1 {format_time(spread)} per loop (mean \xb1 std. dev. of "
            f"{repeat} run{'s' if repeat != 1 else ''}, {number:,} loop"
            f"{'s' if number != 1 else ''} each)"
        )
    return runs if keep else None


def _timeit_options(line: str) -> tuple[list[tuple[str, str]], str]:
    """The leading options of a %timeit line, and the statement after them."""
    options: list[tuple[str, str]] = []
    rest = line.strip()
    while rest.startswith("-"):
        flag, _, rest = rest.partition(" ")
        rest = rest.lstrip()
        if flag in ("-n", "-r"):
            value, _, rest = rest.partition(" ")
            options.append((flag, value))
            rest = rest.lstrip()
        elif flag in ("-q", "-o", "-p", "-t", "-c"):
            options.append((flag, ""))
        else:
            raise UsageError(f"%timeit: option {flag} not recognized")
    return options, rest


def _writefile(shell: CellShell, line: str, cell: str | None = None) -> None:
    if cell is None:
        raise UsageError("%%writefile is a cell magic: %%writefile FILE, then the file's lines")
    words = shlex.split(line)
    append = bool(words) and words[0] in ("-a", "--append")
    if append:
        words = words[1:]
    if len(words) != 1:
        raise UsageError("usage: %%writefile [-a] FILE")
    path = os.path.expanduser(words[0])
    exists = os.path.exists(path)
    if append:
        print(f"Appending to {path}")
    else:
        print(f"{'Overwriting' if exists else 'Writing'} {path}")
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        f.write(cell)


def _cd(shell: CellShell, line: str, cell: str | None = None) -> None:
    target = line.strip().strip("'\"")
    if target == "-":
        target = shell.previous_dir or os.getcwd()
    elif not target:
        target = os.path.expanduser("~")
    before = os.getcwd()
    try:
        os.chdir(os.path.expanduser(target))
    except OSError as exc:
        print(f"[Errno {exc.errno}] {exc.strerror}: {target!r}", file=sys.stderr)
        return
    shell.previous_dir = before
    print(os.getcwd())


def _env(shell: CellShell, line: str, cell: str | None = None) -> Any:
    line = line.strip()
    if not line:
        return dict(os.environ)
    if "=" in line.split(" ", 1)[0]:
        name, _, value = line.partition("=")
    elif " " in line:
        name, _, value = line.partition(" ")
    else:
        try:
            return os.environ[line]
        except KeyError:
            raise UsageError(f"Environment does not have key: {line}") from None
    name, value = name.strip(), shell.var_expand(value.strip())
    os.environ[name] = value
    print(f"env: {name}={value}")
    return None


def _pip(shell: CellShell, line: str, cell: str | None = None) -> None:
    shell.pip(shlex.split(line))


def _bash(shell: CellShell, line: str, cell: str | None = None) -> None:
    shell.run_script("/bin/bash", cell or "")


def _sh(shell: CellShell, line: str, cell: str | None = None) -> None:
    shell.run_script("/bin/sh", cell or "")


def _ignored(shell: CellShell, line: str, cell: str | None = None) -> None:
    return None


LINE_MAGICS: dict[str, Callable[..., Any]] = {
    "time": _time,
    "timeit": _timeit,
    "cd": _cd,
    "env": _env,
    "pip": _pip,
    "matplotlib": _ignored,
}
CELL_MAGICS: dict[str, Callable[..., Any]] = {
    "time": _time,
    "timeit": _timeit,
    "writefile": _writefile,
    "bash": _bash,
    "sh": _sh,
}
