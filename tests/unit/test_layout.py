"""Folder rules: the tree shows the processes, and each outside system is touched by one place.

sandbox_service/
  (top)       the pure core: execution, jobs, keys, settings, logs, cli (entry point); the wire
              models are the client's (trainer_client.wire), imported from there
  api/        the API process (FastAPI); api/compat/ its peer-compatible routes
  worker/     the worker processes (RQ, one jail slot each)
  broker/     Redis + RQ, shared by the API and the workers
  jail/       nsjail and the zygote (zygote.py runs inside the jail, standard library only)
  local/      processes on this host: `rl-sandbox up`, private Redis, child processes
  bench/      `rl-sandbox bench`
"""

from __future__ import annotations

import ast
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


@pytest.mark.parametrize("module", ["zygote.py", "protocol.py"])
def test_the_zygote_imports_only_the_standard_library(module: str) -> None:
    # zygote.py imports protocol.py relatively (by path, inside the jail): not counted here.
    names = _imports(ROOT / "jail" / module)
    assert not [n for n in names if n.split(".")[0] in ("sandbox_service", "redis", "rq", "nsjail")]


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
