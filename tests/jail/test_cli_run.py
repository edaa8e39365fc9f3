"""`rl-sandbox run`: one program in the jail from the command line, the result as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIELDS = {
    "id", "status", "exit_code", "signal", "stdout", "stderr", "stdout_truncated",
    "stderr_truncated", "stdout_bytes", "stderr_bytes", "wall_time", "cpu_time",
    "peak_memory_mb", "queue_time", "files",
    "restored", "display", "error", "compile",
}  # fmt: skip


def rl_sandbox(*args: str, stdin: str = "") -> dict[str, object]:
    env = {"PATH": "/usr/bin:/bin", "RL_SANDBOX_CGROUP_PARENT": "rl-sandbox-test"}
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
