"""Notebook syntax in a cell (`!cmd`, `x = !cmd`, `%magic`, `%%magic`), turned into Python by
IPython's own input transformer (`IPython.core.inputtransformer2.TransformerManager`), whose
output calls `get_ipython()` (shell.CellShell).

Only a cell with a line that starts with `!` or `%` (after an assignment, for `x = !cmd`) is
transformed; any other cell is compiled as it is, with nothing imported. The transformer and
the two IPython utility modules it needs are loaded from their files alone: importing them as
`IPython.core.inputtransformer2` would run the `IPython` package's __init__, which imports the
whole interactive shell (1.4 s against 35-47 ms for these three, docs/jail.md).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

_NOTEBOOK_LINE = re.compile(r"^[ \t]*(?:[\w.\[\]'\", \t]*=[ \t]*)?[!%]", re.MULTILINE)
"""A line IPython would transform: a shell command or a magic, maybe assigned. A line of
Python never starts so (a `%` continuing an expression in brackets, which this also matches,
is left as it is by the transformer, which tokenizes)."""
_PRIVATE_PACKAGE = "rl_sandbox_ipython"
_LOADED: dict[str, types.ModuleType] = {}


def has_notebook_syntax(source: str) -> bool:
    return _NOTEBOOK_LINE.search(source) is not None


def notebook_source(source: str) -> str:
    """The cell as Python: transformed by IPython if it has notebook syntax, else as it is."""
    if not has_notebook_syntax(source):
        return source
    manager = _ipython_module("core/inputtransformer2.py").TransformerManager()
    return str(manager.transform_cell(source))


def ipython_text() -> Any:
    """IPython.utils.text (DollarFormatter, SList), loaded alone."""
    return _ipython_module("utils/text.py")


def _ipython_module(relative: str) -> Any:
    module = _LOADED.get(relative)
    if module is not None:
        return module
    directory = _ipython_directory()
    if relative == "core/inputtransformer2.py":
        tokenutil = _ipython_module("utils/tokenutil.py")
        module = _with_ipython_utils(tokenutil, lambda: _load(directory, relative))
    else:
        module = _load(directory, relative)
    _LOADED[relative] = module
    return module


def _ipython_directory() -> str:
    """Where the image's IPython package is (not one the program wrote in its directory)."""
    spec = importlib.machinery.PathFinder.find_spec(
        "IPython", [entry for entry in sys.path if os.path.isabs(entry)]
    )
    if spec is None or spec.origin is None:
        raise ImportError("IPython is not installed in the image: notebook syntax is unavailable")
    return os.path.dirname(spec.origin)


def _load(directory: str, relative: str) -> types.ModuleType:
    name = f"{_PRIVATE_PACKAGE}.{relative.removesuffix('.py').replace('/', '.')}"
    spec = importlib.util.spec_from_file_location(name, os.path.join(directory, relative))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load IPython's {relative}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with_ipython_utils(
    tokenutil: types.ModuleType, load: Callable[[], types.ModuleType]
) -> types.ModuleType:
    """Run `load` while `from IPython.utils import tokenutil` finds the module loaded here;
    the program's own `import IPython` afterwards is the real package, unaffected."""
    if "IPython" in sys.modules:  # the program imported IPython: the cost is paid
        return load()
    package, utils = types.ModuleType("IPython"), types.ModuleType("IPython.utils")
    package.__path__, utils.__path__ = [], []
    utils.tokenutil = tokenutil  # type: ignore[attr-defined]
    package.utils = utils  # type: ignore[attr-defined]
    stand_ins = {"IPython": package, "IPython.utils": utils, "IPython.utils.tokenutil": tokenutil}
    sys.modules.update(stand_ins)
    try:
        return load()
    finally:
        for name, module in stand_ins.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]
