"""Environments that tests install as users would, by uv from the registry, into small venvs
cached under ~/.cache/rl-sandbox (keyed by their requirements; uv's package cache makes a rebuild
seconds): the trainers' (tests/integrations) and the peers' SDKs (tests/compat)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON_VERSION = "3.12"


def uv() -> str:
    """The uv that `make setup` installs into .venv (or one on PATH)."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    assert found, "uv is needed (make setup installs it into .venv)"
    return found


def _run(args: list[str]) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{args}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


def cached_python(name: str, requirements: tuple[str, ...], no_deps: tuple[str, ...] = ()) -> Path:
    """The interpreter of the cached environment `name`, built on first use; `no_deps` are
    installed without their dependencies."""
    key = hashlib.sha256("\n".join((PYTHON_VERSION, *requirements, *no_deps)).encode()).hexdigest()
    venv = Path.home() / ".cache" / "rl-sandbox" / f"{name}-env-{key[:12]}"
    python = venv / "bin" / "python"
    if (venv / ".complete").exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    interpreter = subprocess.run(
        [str(REPO / "scripts" / "find-python.sh"), PYTHON_VERSION],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    _run([uv(), "venv", "-q", "--python", interpreter, str(venv)])
    _run([uv(), "pip", "install", "-q", "--python", str(python), *requirements])
    if no_deps:
        _run([uv(), "pip", "install", "-q", "--python", str(python), "--no-deps", *no_deps])
    (venv / ".complete").write_text("\n".join((*requirements, *no_deps)) + "\n")
    return python
