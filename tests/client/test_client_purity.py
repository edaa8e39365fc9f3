"""The client's pure modules touch no outside system: only http.py imports httpx; no service."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trainer_client

PACKAGE = Path(trainer_client.__file__).parent
PURE = ["bench", "clock", "dispatch", "errors", "retry", "stats", "tools"]
OUTSIDE = {"httpx", "fastapi", "rq", "redis", "requests", "aiohttp", "starlette", "uvicorn"}


def imported_top_level(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("module", PURE)
def test_pure_modules_import_no_outside_system(module: str) -> None:
    assert imported_top_level(PACKAGE / f"{module}.py") & OUTSIDE == set()


def test_only_the_http_edge_and_the_client_import_httpx() -> None:
    importers = {p.stem for p in PACKAGE.glob("*.py") if "httpx" in imported_top_level(p)}
    assert importers == {"http", "client"}


def test_the_client_imports_nothing_of_the_service() -> None:
    # It installs alone (clients/python): the service imports the client's wire models, never
    # the other way round.
    for path in PACKAGE.rglob("*.py"):
        assert not {n for n in imported_top_level(path) if n in ("sandbox_service", "rl")}, path
