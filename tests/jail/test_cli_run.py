"""`rl-sandbox run`: one program in the jail from the command line, the result as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.host_tag import JAIL_CGROUP_PARENT

FIELDS = {
    "id", "status", "exit_code", "signal", "stdout", "stderr", "stdout_truncated",
    "stderr_truncated", "stdout_bytes", "stderr_bytes", "wall_time", "cpu_time",
    "peak_memory_mb", "queue_time", "files",
    "restored", "display", "error", "compile",
}  # fmt: skip


def rl_sandbox(*args: str, stdin: str = "") -> dict[str, object]:
    env = {"PATH": "/usr/bin:/bin", "RL_SANDBOX_CGROUP_PARENT": JAIL_CGROUP_PARENT}
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_service.cli", "run", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("mode", ["warm", "cold"])
def test_run_from_stdin_prints_an_execute_result(mode: str) -> None:
    result = rl_sandbox("--mode", mode, "--stdin", "5", "-", stdin="print(int(input()) * 2)")
    assert set(result) == FIELDS
    assert (result["status"], result["stdout"], result["exit_code"]) == ("ok", "10\n", 0)


def test_run_a_file_with_limits(tmp_path: Path) -> None:
    program = tmp_path / "spin.py"
    program.write_text("while True: pass\n")
    result = rl_sandbox("--timeout", "0.5", "--memory-mb", "64", str(program))
    assert result["status"] == "timeout"


def test_a_reader_that_goes_away_is_no_error() -> None:
    # `rl-sandbox run x.py | head -3`: the pipe closes before the JSON is written.
    env = {"PATH": "/usr/bin:/bin", "RL_SANDBOX_CGROUP_PARENT": JAIL_CGROUP_PARENT}
    command = (
        f"{sys.executable} -m sandbox_service.cli run - | head -c 1 >/dev/null;"
        " echo ${PIPESTATUS[0]} >&2"
    )
    done = subprocess.run(
        ["bash", "-c", command],
        input="for i in range(100000): print(i)\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert "BrokenPipeError" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "0"


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_service.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.startswith("rl-sandbox 0.")


def test_run_another_language() -> None:
    result = rl_sandbox("--language", "bash", "--stdin", "x", "-", stdin="read v; echo got $v")
    assert (result["status"], result["stdout"], result["compile"]) == ("ok", "got x\n", None)


def test_the_language_choices_are_the_services() -> None:
    from sandbox_service.cli import build_parser
    from trainer_client.wire import SUPPORTED_LANGUAGES

    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    language = next(a for a in run._actions if a.dest == "language")
    assert tuple(language.choices or ()) == SUPPORTED_LANGUAGES
