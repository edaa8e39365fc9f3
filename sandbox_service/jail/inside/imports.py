"""A hook that runs code right after a module is first imported (matplotlib's backend, seeds)."""

from __future__ import annotations

import sys
import types
from typing import Any


class _AfterImport:
    """A meta path finder that adjusts a module right after the import system executed it.

    Used for matplotlib, imported on demand: its cache directory is the read-only font list
    the worker built (no font scan in a run whose home is fresh), and pyplot's `show` displays
    figures. It finds nothing itself; a program may remove it, which changes only its own run.
    """

    def __init__(self, hooks: dict[str, Any]) -> None:
        self._hooks = hooks

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        hook = self._hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run_module(module)
            hook(module)

        loader.exec_module = exec_module  # this module's own loader object
        return spec
