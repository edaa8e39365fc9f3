"""Start the in-jail program: `python -s -P -B /opt/rl-sandbox/inside/__main__.py --control-fd N`.

Run as a script, this file loads its own directory as the package `rl_sandbox_inside` by path,
so that sys.path stays as `-s -P` left it: the program, forked from this interpreter, finds none
of these modules by its own imports (as under `python -I`, whose -E the jail cannot take: it
would ignore PYTHONHASHSEED).
"""

import importlib
import importlib.util
import os
import sys

PACKAGE_IN_JAIL = "rl_sandbox_inside"


def _load_package(directory: str) -> None:
    spec = importlib.util.spec_from_file_location(
        PACKAGE_IN_JAIL,
        os.path.join(directory, "__init__.py"),
        submodule_search_locations=[directory],
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE_IN_JAIL] = package  # the siblings' relative imports look it up
    spec.loader.exec_module(package)


if __name__ == "__main__":
    if __package__:
        package = __package__
    else:
        _load_package(os.path.dirname(os.path.abspath(__file__)))
        package = PACKAGE_IN_JAIL
    importlib.import_module(f"{package}.pid1").main()
