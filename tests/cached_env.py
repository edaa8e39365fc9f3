"""Environments that tests install as users would, by uv from the registry, into small venvs
cached under ~/.cache/rl-sandbox (keyed by their requirements; uv's package cache makes a rebuild
seconds): the trainers' (tests/integrations) and the peers' SDKs (tests/compat)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
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

    def install(interpreter: str, venv: Path, python: Path) -> None:
        _run([uv(), "venv", "-q", "--python", interpreter, str(venv)])
        _run([uv(), "pip", "install", "-q", "--python", str(python), *requirements])
        if no_deps:
            _run([uv(), "pip", "install", "-q", "--python", str(python), "--no-deps", *no_deps])

    return _cached(name, PYTHON_VERSION, (*requirements, *no_deps), install)


def cached_pip_python(
    name: str, python_version: str, requirements: tuple[str, ...], remove: tuple[str, ...] = ()
) -> Path:
    """The interpreter of the cached environment `name`, made by the stock venv and pip of
    Python `python_version` (pip, not uv: pip honours the host's own wheel directories, such as
    a CPU build of torch, where uv would fetch the index's), with `remove` uninstalled after:
    an environment exactly as small as a bare GPU host's."""

    def install(interpreter: str, venv: Path, python: Path) -> None:
        _run([interpreter, "-m", "venv", str(venv)])
        _run([str(python), "-m", "pip", "install", "-q", *requirements])
        if remove:
            _run([str(python), "-m", "pip", "uninstall", "-q", "-y", *remove])

    return _cached(name, python_version, (*requirements, "-", *remove), install)


def _cached(
    name: str,
    python_version: str,
    contents: tuple[str, ...],
    install: Callable[[str, Path, Path], None],
) -> Path:
    """The interpreter of ~/.cache/rl-sandbox/<name>-env-<key of the version and contents>,
    built by install(interpreter of python_version, venv, its python) when not complete."""
    key = hashlib.sha256("\n".join((python_version, *contents)).encode()).hexdigest()
    venv = Path.home() / ".cache" / "rl-sandbox" / f"{name}-env-{key[:12]}"
    python = venv / "bin" / "python"
    if (venv / ".complete").exists():
        return python
    shutil.rmtree(venv, ignore_errors=True)
    interpreter = subprocess.run(
        [str(REPO / "scripts" / "find-python.sh"), python_version],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    install(interpreter, venv, python)
    (venv / ".complete").write_text("\n".join(contents) + "\n")
    return python
