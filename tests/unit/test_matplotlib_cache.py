"""matplotlib's font cache: built once per interpreter and version, complete or absent."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sandbox_service.jail import matplotlib_cache

pytest.importorskip("matplotlib")


def test_the_font_list_is_built_once_and_names_no_host_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home-with-fonts"))
    built = matplotlib_cache.font_cache(sys.executable, root=tmp_path)
    assert built is not None and built.parent == tmp_path
    (fontlist,) = built.iterdir()  # only the list: nothing else of a config directory
    assert fontlist.name.startswith("fontlist-v") and fontlist.stat().st_mode & 0o777 == 0o644
    assert built.stat().st_mode & 0o777 == 0o755
    entries = json.loads(fontlist.read_text())
    names = [entry["fname"] for entry in entries["ttflist"] + entries["afmlist"]]
    # matplotlib's own fonts relative to its data directory (the jail mounts the venv
    # elsewhere), system fonts under /usr (mounted at the same place), nothing else.
    assert any(not name.startswith("/") for name in names)
    assert all(not name.startswith("/") or name.startswith("/usr/") for name in names), names
    stamp = fontlist.stat().st_mtime_ns
    assert matplotlib_cache.font_cache(sys.executable, root=tmp_path) == built
    assert fontlist.stat().st_mtime_ns == stamp  # not built again
    assert [p.name for p in tmp_path.iterdir()] == [built.name]  # no staging left


def test_an_interpreter_without_matplotlib_has_no_cache(tmp_path: Path) -> None:
    bare = Path(sys.base_prefix) / "bin" / "python3"
    if not bare.exists() or matplotlib_cache.matplotlib_version(str(bare)) is not None:
        pytest.skip("the base interpreter has matplotlib")
    assert matplotlib_cache.font_cache(str(bare), root=tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_the_key_names_the_version() -> None:
    key = matplotlib_cache.cache_key(sys.executable, "3.11.2")
    assert key.startswith("matplotlib-3.11.2-")
    assert key != matplotlib_cache.cache_key(sys.executable, "3.11.3")
