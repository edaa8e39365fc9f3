"""What `get_ipython()` is in a cell that uses notebook syntax: the calls IPython's input
transformer writes (`system`, `getoutput`, `run_line_magic`, `run_cell_magic`), run in the
cell's own process and jail.

A `!` command is `/bin/sh -c` as the program's uid, in the cell's working directory, with the
cell's standard streams (its output is the cell's, bounded as the cell's is) and under the
cell's limits; it is killed with everything else the cell started once the cell is over.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from typing import Any

from . import magics, pip_answer
from .cell_syntax import ipython_text, notebook_source

MAX_GETOUTPUT_BYTES = 8 << 20
"""Most output `x = !cmd` keeps; the command is killed past it."""
_NAME = re.compile(r"\$(\$|[A-Za-z_][A-Za-z0-9_]*)")


class CellShell:
    """The notebook shell of one session's namespace."""

    def __init__(self, user_ns: dict[str, Any]) -> None:
        self.user_ns = user_ns
        self.previous_dir: str | None = None

    def get_ipython(self) -> CellShell:
        return self

    def transform(self, source: str) -> str:
        return notebook_source(source)

    def var_expand(self, command: str) -> str:
        """`{expression}` and `$name` in a command, from the cell's namespace, as IPython
        expands them (`$$` is a `$`); the command unchanged if it does not expand."""
        try:
            formatter = ipython_text().DollarFormatter()
            return str(formatter.vformat(command, args=[], kwargs=self.user_ns))
        except Exception:  # IPython, too, runs the command as written
            return command

    def system(self, command: str) -> None:
        """`!command`: its status in `_exit_code`, as IPython sets it."""
        command = self.var_expand(command)
        words = pip_answer.pip_words(command)
        if words is not None:
            self.pip(words)
            return
        self.user_ns["_exit_code"] = self._run(["/bin/sh", "-c", command])

    def getoutput(self, command: str, split: bool = True, depth: int = 0) -> Any:
        """`x = !command`: its output (stdout and stderr) as a list of lines."""
        command = self.var_expand(command)
        _flush()
        try:
            process = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=_environment(),
            )
        except OSError as exc:
            return [f"/bin/sh: {exc.strerror}"]
        assert process.stdout is not None
        data = process.stdout.read(MAX_GETOUTPUT_BYTES)
        process.kill()
        process.wait()
        text = data.decode("utf-8", errors="replace")
        if not split:
            return text
        return _lines(text)

    def run_line_magic(self, name: str, line: str, _stack_depth: int = 1) -> Any:
        magic = magics.LINE_MAGICS.get(name)
        if magic is None:
            raise magics.UsageError(f"Line magic function `%{name}` not found.")
        return magic(self, line)

    def run_cell_magic(self, name: str, line: str, cell: str) -> Any:
        magic = magics.CELL_MAGICS.get(name)
        if magic is None:
            raise magics.UsageError(f"Cell magic `%%{name}` not found.")
        return magic(self, line, cell)

    def pip(self, args: list[str]) -> None:
        """pip's answer (pip_answer): the jail has no network."""
        answer = pip_answer.answer(args)
        _flush()
        sys.stdout.write(answer.stdout)
        sys.stderr.write(answer.stderr)
        _flush()
        self.user_ns["_exit_code"] = answer.status

    def run_script(self, program: str, script: str) -> None:
        """`%%bash` / `%%sh`: the cell's lines run by that shell."""
        self._run([program, "-c", script])

    def _run(self, argv: list[str]) -> int:
        _flush()
        try:
            return subprocess.run(argv, env=_environment(), check=False).returncode
        except OSError as exc:
            print(f"{argv[0]}: {exc.strerror}", file=sys.stderr)
            return 127


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def _environment() -> dict[str, str]:
    """The cell's environment, with the interpreter's directory first on PATH: `!python` and
    `!pip` are the cell's own."""
    env = dict(os.environ)
    here = os.path.dirname(sys.executable)
    if here:
        env["PATH"] = f"{here}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


def _lines(text: str) -> Any:
    lines = text.splitlines()
    try:
        return ipython_text().SList(lines)
    except ImportError:
        return lines


def shell_of(namespace: dict[str, Any]) -> CellShell:
    """The namespace's shell, made on its first notebook-syntax cell and kept in it as
    `get_ipython` (IPython's name), for the cells that follow."""
    existing = namespace.get("get_ipython")
    shell = getattr(existing, "__self__", None)
    if isinstance(shell, CellShell) and shell.user_ns is namespace:
        return shell
    shell = CellShell(namespace)
    namespace["get_ipython"] = shell.get_ipython
    return shell
