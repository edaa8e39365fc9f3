"""Folder rules: the tree shows the processes, and each outside system is touched by one place.

sandbox_service/
  (top)       the pure core: execution, jobs, keys, settings, logs, cli (entry point); the wire
              models are the client's (trainer_client.wire), imported from there
  api/        the API process (FastAPI); api/compat/ its peer-compatible routes
  worker/     the worker processes (RQ, one jail slot each)
  broker/     Redis + RQ, shared by the API and the workers
  jail/       nsjail and the zygote (jail/inside/ runs inside the jail, standard library only)
  local/      processes on this host: `rl-sandbox up`, private Redis, child processes
  bench/      `rl-sandbox bench`
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import sandbox_service

ROOT = Path(sandbox_service.__file__).parent
CORE = ("execution", "jobs", "keys", "settings", "logs")


def _imports(path: Path) -> set[str]:
    """Every module name `path` imports (absolute names, at any depth of the file)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _modules() -> dict[str, set[str]]:
    return {
        path.relative_to(ROOT).as_posix(): _imports(path)
        for path in sorted(ROOT.rglob("*.py"))
        if ".venv" not in path.parts
    }


def _importers(prefix: str) -> list[str]:
    return sorted(
        module
        for module, names in _modules().items()
        if any(name == prefix or name.startswith(prefix + ".") for name in names)
    )


@pytest.mark.parametrize("library", ["fastapi", "starlette", "uvicorn"])
def test_only_the_api_folder_imports_the_http_server(library: str) -> None:
    outside = [m for m in _importers(library) if not m.startswith("api/")]
    assert outside == []


def test_only_jobqueue_imports_rq() -> None:
    assert _importers("rq") == ["broker/jobqueue.py"]


def test_only_the_jail_folder_runs_nsjail() -> None:
    outside = [m for m in _importers("nsjail") if not m.startswith("jail/")]
    assert outside == []


INSIDE = ROOT / "jail" / "inside"
JAILED_STACK = {"numpy", "scipy", "sympy", "mpmath", "matplotlib"}
"""The scientific stack of the jail's interpreter, which the warm zygote preloads and exercises."""
JAILED_ON_DEMAND = {"packaging"}
"""Dependencies of the service that a cell's `!pip install` answer imports when it needs them
(pip_answer.py: pip's own version specifiers), never the zygote."""


def _inside_imports(path: Path) -> tuple[set[str], set[str]]:
    """The absolute module names `path` imports, and the siblings it imports relatively."""
    absolute: set[str] = set()
    siblings: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            absolute.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            absolute.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            siblings.update([node.module] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom):
            siblings.add("." * node.level + (node.module or ""))  # above inside/: never allowed
    return absolute, siblings


@pytest.mark.parametrize("path", sorted(INSIDE.glob("*.py")), ids=lambda path: path.name)
def test_the_in_jail_program_imports_only_the_standard_library_and_its_siblings(
    path: Path,
) -> None:
    absolute, siblings = _inside_imports(path)
    outside_stdlib = [
        n
        for n in absolute
        if n.split(".")[0]
        not in sys.stdlib_module_names | JAILED_STACK | JAILED_ON_DEMAND | {"__future__"}
    ]
    assert outside_stdlib == []
    modules = {p.stem for p in INSIDE.glob("*.py")}
    assert siblings <= modules, siblings - modules


def _names_of_inside_modules(path: Path) -> set[str]:
    """The modules of jail/inside/ that `path` (outside it) imports, by any form of import."""
    package = "sandbox_service." + ".".join(path.parent.relative_to(ROOT).parts)
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            named.update(f"{base}.{alias.name}" for alias in node.names)
            named.add(base)
    prefix = "sandbox_service.jail.inside."
    return {n.removeprefix(prefix).split(".")[0] for n in named if n.startswith(prefix)}


def test_the_worker_side_imports_only_the_protocol_of_the_in_jail_program() -> None:
    crossing = {
        path.relative_to(ROOT).as_posix(): sorted(names - {"protocol"})
        for path in sorted(ROOT.rglob("*.py"))
        if INSIDE not in path.parents and (names := _names_of_inside_modules(path)) - {"protocol"}
    }
    assert crossing == {}


def test_the_core_imports_no_process_folder() -> None:
    folders = ("api", "worker", "broker", "jail", "local", "bench")
    for module in CORE:
        names = _imports(ROOT / f"{module}.py")
        crossing = [n for n in names if n.split(".")[:2][-1] in folders and "sandbox_service" in n]
        assert crossing == [], module


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("api", ("worker", "jail", "local", "bench")),
        ("worker", ("api", "bench")),
        ("broker", ("api", "worker", "jail", "local", "bench")),
        ("jail", ("api", "worker", "broker", "local", "bench")),
    ],
)
def test_process_folders_do_not_import_each_other(folder: str, forbidden: tuple[str, ...]) -> None:
    bad = {
        module: sorted(
            n for n in names if any(n.startswith(f"sandbox_service.{f}") for f in forbidden)
        )
        for module, names in _modules().items()
        if module.startswith(f"{folder}/")
    }
    assert {m: n for m, n in bad.items() if n} == {}


def test_one_module_writes_the_liveness_set() -> None:
    writers = sorted(
        module
        for module in _modules()
        if "keys.alive(" in (text := (ROOT / module).read_text())
        and any(op in text for op in ("zadd(", "zrem("))
    )
    assert writers == ["broker/liveness.py"]
    liveness = (ROOT / "broker" / "liveness.py").read_text()
    assert "zadd(" in liveness and "zrem(" in liveness
