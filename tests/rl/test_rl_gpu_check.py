"""scripts/gpu_check.py on the CPU: its help, its spawn-safety, and the dry run of part (a)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def run(*args: str, timeout: float = 110) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def test_help_names_both_parts() -> None:
    out = run(str(SCRIPT), "--help")
    assert out.returncode == 0, out.stderr
    assert "--vllm-model" in out.stdout and "--device" in out.stdout and "--jail" in out.stdout


def test_a_re_import_by_a_spawned_process_runs_nothing() -> None:
    # multiprocessing's spawn (the IPC check's child, vLLM's engine core) runs the main module
    # again under the name __mp_main__: only the guarded main may start the check.
    code = f"import runpy; runpy.run_path({str(SCRIPT)!r}, run_name='__mp_main__'); print('done')"
    out = run("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "done\n"


@pytest.mark.slow
def test_the_cpu_dry_run_of_part_a_passes_every_check() -> None:
    out = run(str(SCRIPT), "--device", "cpu", "--jail", "off")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    oks = [line for line in lines if line.startswith("[a] ok ")]
    for what in ("log-probs", "SFT step", "GRPO-RoC update", "FSDP2 on one rank (gloo)", "spawned"):
        assert any(what in line for line in oks), (what, out.stdout)
    assert not any("FAIL" in line for line in lines), out.stdout
    assert "bytes equal: True" in out.stdout and "nothing stood in" in out.stdout
    assert "[b] skipped" in out.stdout and lines[-1].endswith("0 failed")
