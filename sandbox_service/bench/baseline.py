"""The fair baselines: a fresh interpreter per call, as a user without rl-sandbox would run it.

`plain venv`: a plain (non-editable) virtual environment holding the same versions of sympy,
numpy and mpmath as this one, made once by the bench and cached. The project's own venv would
flatter the service: its `site` imports the editable install's path finder (about 30 ms of CPU
per interpreter). `python -I -S`: the base interpreter without `site` at all, the floor of a
fresh process, for the workloads that import nothing outside the standard library.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("sympy", "numpy", "mpmath")
"""What the plain venv installs, each at the version installed here."""
INSTALL_TIMEOUT_S = 900.0


@dataclass(frozen=True, slots=True)
class Baseline:
    """One way of running a call in a fresh interpreter."""

    name: str
    argv: tuple[str, ...]
    """The command line before the program's code."""
    stdlib_only: bool
    """Only for workloads that import nothing outside the standard library."""


def base_python() -> Path:
    """The interpreter this one's virtual environment was made from."""
    return Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"


def pinned_packages() -> tuple[str, ...]:
    """`name==version` of each of PACKAGES installed here."""
    pins = []
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            pins.append(f"{name}=={importlib.metadata.version(name)}")
    return tuple(pins)


def cache_dir() -> Path:
    """Where made venvs are kept between runs (XDG cache)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "rl-sandbox"


def venv_key(python: Path, pins: tuple[str, ...]) -> str:
    """The cache key of a plain venv: its interpreter, its version and its packages."""
    text = "\n".join((str(python.resolve()), sys.version, *pins))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plain_venv(root: Path | None = None) -> Path:
    """The interpreter of the plain venv, made (minutes, once) unless already cached."""
    python, pins = base_python(), pinned_packages()
    dest = (root or cache_dir()) / f"baseline-venv-{venv_key(python, pins)}"
    done = dest / ".complete"
    if done.exists():
        return dest / "bin" / "python"
    dest.parent.mkdir(parents=True, exist_ok=True)
    print(f"making the baseline's plain venv {dest} (once)", file=sys.stderr, flush=True)
    building = dest.with_name(f"{dest.name}.building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    try:
        subprocess.run([str(python), "-m", "venv", "--without-pip", str(building)], check=True)
        _install(building / "bin" / "python", pins)
        (building / ".complete").write_text("\n".join(pins) + "\n")
        try:
            building.rename(dest)
        except OSError:  # another bench made it meanwhile
            if not done.exists():
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return dest / "bin" / "python"


def _install(python: Path, pins: tuple[str, ...]) -> None:
    # Bytecode compiled at install time, as a normal `pip install` does: otherwise the first
    # calls of the baseline would pay for compiling sympy.
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv:
        argv = [uv, "pip", "install", "--quiet", "--compile-bytecode", "--python", str(python)]
    else:
        argv = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    if pins:
        subprocess.run([*argv, *pins], check=True, timeout=INSTALL_TIMEOUT_S)


def baselines(root: Path | None = None) -> tuple[Baseline, ...]:
    """The fair baselines, the plain venv made first if needed."""
    return (
        Baseline("plain venv", (str(plain_venv(root)), "-c"), stdlib_only=False),
        Baseline("python -I -S", (str(base_python()), "-I", "-S", "-c"), stdlib_only=True),
    )
