"""matplotlib's font cache, built once per interpreter and matplotlib version on the host.

A fresh matplotlib scans every font it can find (seconds) and writes the list to its cache
directory; in the jail that directory would be wiped after every run, so every plotting program
would scan again. The worker builds the list once, here, into a directory the jail mounts
read-only (policy.MATPLOTLIB_CACHE_IN_JAIL); the zygote points matplotlib's cache at it. The
list names matplotlib's own fonts relative to its data directory, and system fonts by their
/usr paths, which the jail mounts at the same place; the build runs with an empty home, so no
font of the host user's is listed.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

BUILD_TIMEOUT_S = 300.0
_VERSION = "import importlib.metadata as m; print(m.version('matplotlib'))"
_BUILD = "import matplotlib.font_manager as f; f.fontManager.findfont('DejaVu Sans')"
_LOCK = threading.Lock()


def cache_root() -> Path:
    """Where built caches are kept between worker starts (XDG cache)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "rl-sandbox"


def matplotlib_version(python: str) -> str | None:
    """The version of matplotlib that `python` imports; None when it has none."""
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        import importlib.metadata

        try:
            return importlib.metadata.version("matplotlib")
        except importlib.metadata.PackageNotFoundError:
            return None
    done = subprocess.run(
        [python, "-I", "-c", _VERSION], capture_output=True, text=True, timeout=60, check=False
    )
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def cache_key(python: str, version: str) -> str:
    """The cache's name: the interpreter (its real path) and the matplotlib version."""
    digest = hashlib.sha256(f"{os.path.realpath(python)}\0{version}".encode()).hexdigest()
    return f"matplotlib-{version}-{digest[:12]}"


def font_cache(python: str, root: Path | None = None) -> Path | None:
    """The directory holding the font list of `python`'s matplotlib, built unless already there;
    None when it has no matplotlib or the build failed (programs then scan fonts themselves)."""
    try:
        version = matplotlib_version(python)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("matplotlib's version unknown", extra={"error": str(exc)})
        return None
    if version is None:
        return None
    dest = (root or cache_root()) / cache_key(python, version)
    with _LOCK:
        if _complete(dest):
            return dest
        try:
            _build(python, dest)
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            log.warning("matplotlib's font cache not built", extra={"error": str(exc)})
            return None
    return dest


def _complete(path: Path) -> bool:
    return any(path.glob("fontlist-v*.json"))


def _build(python: str, dest: Path) -> None:
    """Build into a fresh directory beside `dest`, then rename it there (atomic: concurrent
    workers each build, one rename wins and the others' copies are removed)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="rl-sandbox-mpl-home-") as home:
            env = {"PATH": "/usr/bin:/bin", "HOME": home, "MPLCONFIGDIR": str(staging)}
            env["MPLBACKEND"] = "Agg"
            done = subprocess.run(
                [python, "-I", "-c", _BUILD],
                env=env,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
        if done.returncode != 0 or not _complete(staging):
            raise RuntimeError(f"font list not built: {done.stderr.strip()[-500:]}")
        # Only the font list is kept: the jail reads it, nothing else of this directory.
        for entry in staging.iterdir():
            if not entry.name.startswith("fontlist-v"):
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            else:
                entry.chmod(0o644)
        staging.chmod(0o755)
        try:
            staging.rename(dest)
        except OSError:
            if not _complete(dest):
                raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
