"""scripts/gpu_check.py on the CPU: its help, its spawn-safety, the dry run of part (a), on this
environment and on one as bare as the lent GPU host's (torch, transformers, tokenizers, numpy,
msgpack, nothing else), and the bundle it carries."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
if str(ROOT) not in sys.path:  # tests/rl is imported as rootdir modules: tests/ by the repository
    sys.path.append(str(ROOT))
from tests.cached_env import cached_pip_python  # noqa: E402


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


BARE_HOST = ("torch==2.13.0", "transformers", "tokenizers", "numpy", "msgpack")
"""What the lent GPU host has (torch CPU here; its torch is 2.11+cu130, transformers 5.x)."""
NOT_ON_THE_HOST = ("pydantic", "pydantic-core")
"""Brought by transformers' command line (typer) here; absent on the host."""


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first run builds the environment (pip, ~3 min); then cached
def test_the_check_passes_on_a_python_with_only_torch_transformers_tokenizers_numpy_msgpack(
    tmp_path: Path,
) -> None:
    python = cached_pip_python("gpu-check-bare", "3.11", BARE_HOST, remove=NOT_ON_THE_HOST)
    for absent in ("pydantic", "httpx", "fastapi", "redis"):
        probe = subprocess.run([str(python), "-c", f"import {absent}"], capture_output=True)
        assert probe.returncode != 0, f"{absent} is importable: the environment is not bare"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [str(python), str(SCRIPT), "--device", "cpu", "--jail", "auto"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert not any("FAIL" in line for line in lines), out.stdout
    for what in ("log-probs", "SFT step", "GRPO-RoC update", "FSDP2 on one rank", "rl_load_bucket"):
        assert any(line.startswith("[a] ok ") and what in line for line in lines), what
    assert "Python 3.11" in out.stdout and lines[-1].endswith("0 failed")


@pytest.mark.slow
def test_the_bundle_is_written_within_its_limit_and_names_the_command(tmp_path: Path) -> None:
    code = (
        "import runpy, sys; from pathlib import Path; "
        f"g = runpy.run_path({str(SCRIPT)!r}, run_name='gpu_check'); "
        f"g['main'].__globals__['BUNDLE'] = Path({str(tmp_path / 'bundle')!r}); "
        "sys.exit(g['main'](['--bundle']))"
    )
    out = run("-c", code)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "MiB (limit 64 MiB)" in out.stdout and "python3 scripts/gpu_check.py" in out.stdout
    model = tmp_path / "bundle" / "tiny-qwen2"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        p.name for p in model.iterdir()
    }
    assert sum(p.stat().st_size for p in (tmp_path / "bundle").rglob("*")) <= 64 << 20
