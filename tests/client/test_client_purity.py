"""The client's pure modules touch no outside system: only http.py imports httpx; no service.

Of the trainer integrations, only integrations/verl.py imports a trainer (verl); the others
import as the rest of the client does, with httpx and pydantic alone (these tests also run in
the light install, test_client_light_install.py).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import trainer_client

PACKAGE = Path(trainer_client.__file__).parent
PURE = ["bench", "clock", "dispatch", "errors", "retry", "stats", "tools", "integrations/answer"]
TRAINERS = {"verl", "trl", "openrlhf", "torch", "ray", "transformers", "numpy", "sympy"}
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
    importers = {p.stem for p in PACKAGE.rglob("*.py") if "httpx" in imported_top_level(p)}
    assert importers == {"http", "client"}


def test_only_the_verl_adapter_imports_a_trainer() -> None:
    importers = {
        p.relative_to(PACKAGE).as_posix(): imported_top_level(p) & TRAINERS
        for p in PACKAGE.rglob("*.py")
    }
    assert {path: found for path, found in importers.items() if found} == {
        "integrations/verl.py": {"verl"}
    }


def test_the_integrations_load_without_any_trainer() -> None:
    code = (
        "import json, sys\n"
        "import trainer_client.integrations.reward, trainer_client.integrations.clients\n"
        "loaded = sorted(m.split('.')[0] for m in sys.modules)\n"
        "try:\n"
        "    import trainer_client.integrations.verl\n"
        "    verl = 'imported'\n"
        "except ImportError as exc:\n"
        "    verl = str(exc)\n"
        "print(json.dumps([verl, loaded, 'verl' in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    verl, loaded, verl_installed = json.loads(done.stdout)
    assert not set(loaded) & TRAINERS
    # Where verl is absent (here, and in the light install), the message says what is missing.
    assert verl == "imported" if verl_installed else "needs verl (pip install verl)" in verl


def test_the_client_imports_nothing_of_the_service() -> None:
    # It installs alone (clients/python): the service imports the client's wire models, never
    # the other way round.
    for path in PACKAGE.rglob("*.py"):
        assert not {n for n in imported_top_level(path) if n in ("sandbox_service", "rl")}, path
