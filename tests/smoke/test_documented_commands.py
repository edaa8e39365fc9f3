"""Every command the README and docs/ tell a user to run exists and runs (on a tiny scale), so
that a move or a rename cannot silently break one: `make loadtest` once failed on an import that
had moved and nothing noticed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_service.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MAKE_TARGET = re.compile(r"^([a-z][a-z0-9-]*):", re.M)
DOCUMENTED_MAKE = re.compile(r"(?:^|[\s;&(])make ([a-z][a-z0-9-]*)", re.M)
DOCUMENTED_CLI = re.compile(r"(?:^|[\s/;&(])(?<!-n )rl-sandbox ([a-z][a-z-]*)", re.M)
"""`rl-sandbox <subcommand>` (not `kubectl -n rl-sandbox ...`, the namespace)."""
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")


def _code(text: str) -> list[str]:
    """The code of a Markdown text: fenced blocks and inline code spans."""
    fenced = FENCED.findall(text)
    return fenced + INLINE.findall(FENCED.sub("", text))


def _documented(pattern: re.Pattern[str]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        for code in _code(doc.read_text()):
            for name in pattern.findall(code):
                found.setdefault(name, []).append(doc.name)
    return found


def _subcommands() -> set[str]:
    parser = build_parser()
    actions = [a for a in parser._actions if a.choices and a.dest == "command"]
    return set(actions[0].choices) if actions else set()


def test_every_documented_make_target_exists() -> None:
    targets = set(MAKE_TARGET.findall((ROOT / "Makefile").read_text()))
    missing = {t: docs for t, docs in _documented(DOCUMENTED_MAKE).items() if t not in targets}
    assert missing == {}


def test_every_documented_cli_subcommand_exists() -> None:
    subcommands = _subcommands()
    documented = _documented(DOCUMENTED_CLI)
    assert documented, "the docs name no rl-sandbox subcommand: the pattern is wrong"
    missing = {c: docs for c, docs in documented.items() if c not in subcommands}
    assert missing == {}


@pytest.mark.parametrize("subcommand", sorted(_subcommands()))
def test_every_subcommand_answers_help(subcommand: str) -> None:
    argv = [sys.executable, "-m", "sandbox_service.cli", subcommand, "--help"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"rl-sandbox {subcommand}" in done.stdout


def _make(target: str, *variables: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RL_SANDBOX_", "MAKE"))}
    env.pop("REDIS_URL", None)
    argv = ["make", "-s", "-C", str(ROOT), target, *variables]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.slow
def test_make_loadtest_runs_a_few_seconds_of_load(tmp_path: Path) -> None:
    done = _make(
        "loadtest", "LOADTEST_USERS=4", "LOADTEST_TIME=4s", "LOADTEST_SESSIONS=",
        f"LOADTEST_OUT={tmp_path}",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "run.json").exists()
    assert (tmp_path / "locust_stats.csv").exists()


@pytest.mark.slow
def test_make_bench_runs_a_tiny_sweep(tmp_path: Path) -> None:
    args = (
        f"--workloads print --concurrency 2 --point-s 0.5 --max-calls 40 --ratio-rounds 1 "
        f"--workers 1 --no-progress --out {tmp_path}"
    )
    done = _make("bench", f"BENCH_ARGS={args}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "bench.json").exists() and (tmp_path / "bench.md").exists()


@pytest.mark.slow
def test_make_bench_executor_runs_a_tiny_sweep(tmp_path: Path) -> None:
    out = tmp_path / "executor.json"
    args = f"--calls 4 --spaced-calls 2 --gap-ms 20 --rounds 1 --round-calls 8 --json {out}"
    done = _make("bench-executor", f"BENCH_EXECUTOR_ARGS={args}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert out.exists() and out.stat().st_size > 0
