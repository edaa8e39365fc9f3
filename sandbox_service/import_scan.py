"""Which zygote a program should fork from: a static scan of the modules it imports.

A program whose every import is of the standard library (or that names no import at all) runs
from the lean zygote (nothing heavy preloaded, so its fork and exit copy and free a small heap);
one that adds only numpy, sympy, mpmath or scipy runs from the math zygote (those preloaded,
pandas not); any other import, or source that names one and does not parse, runs from the data
zygote (the math stack and pandas). The scan only picks the faster start: an import it cannot
see (`__import__`, `importlib`, `exec`) still works from any zygote, at the cost of the import
in the run. Pure: no I/O.
"""

from __future__ import annotations

import ast
import sys
from typing import Literal

Zygote = Literal["lean", "math", "data"]

LEAN_MODULES = frozenset(sys.stdlib_module_names)
"""Top-level modules a lean program may import: the standard library's."""
MATH_MODULES = LEAN_MODULES | {"numpy", "sympy", "mpmath", "scipy"}
"""Top-level modules a math program may import: the math zygote's preload (scipy's where the
`preload` setting is `full`, else imported in the run from either zygote alike)."""
MAX_SCANNED_CHARS = 64 * 1024
"""Longer programs are not parsed in the worker (their run outweighs a slower start)."""


def imported_modules(code: str) -> frozenset[str] | None:
    """The top-level modules `code` names in import statements anywhere (in functions too);
    None when it does not parse. Relative imports name no installed module."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):  # ValueError: a null byte in the source
        return None
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return frozenset(found)


def zygote_for(code: str) -> Zygote:
    """`lean` when the program imports only the standard library, `math` when it adds only the
    math stack, else `data`."""
    if "import" not in code:
        # No import statement, no __import__ or importlib: nothing to parse (a trivial call's
        # scan was 6 % of the worker's CPU).
        return "lean"
    if len(code) > MAX_SCANNED_CHARS:
        return "data"
    modules = imported_modules(code)
    if modules is None:
        return "data"
    if modules <= LEAN_MODULES:
        return "lean"
    if modules <= MATH_MODULES:
        return "math"
    return "data"
