"""`rl-sandbox train` under torchrun on 2 CPU processes (gloo): the whole trainer sharded, its
checkpoints, and a resume on 2 ranks that goes on exactly as the uninterrupted 2-rank run."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from test_rl_fsdp import TORCHRUN, run_tree
from test_rl_train_run import comparable, read_lines, resume_settings

pytestmark = pytest.mark.slow

CLI = ["-m", "sandbox_service.cli", "train", "--no-progress"]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)


def to_toml(config: dict[str, Any]) -> str:
    """The small subset of TOML a train config needs: tables, arrays of tables, scalars."""
    lines = [f"{k} = {toml_value(v)}" for k, v in config.items() if not isinstance(v, dict | list)]
    for key, value in config.items():
        if isinstance(value, dict):
            lines.append(f"[{key}]")  # a table's scalars before its arrays of tables
            lines.extend(
                f"{k} = {toml_value(v)}" for k, v in value.items() if not isinstance(v, list)
            )
            for k, v in value.items():
                for item in v if isinstance(v, list) else []:
                    lines.append(f"[[{key}.{k}]]")
                    lines.extend(f"{a} = {toml_value(b)}" for a, b in item.items())
        elif isinstance(value, list):
            for item in value:
                lines.append(f"[[{key}]]")
                lines.extend(f"{a} = {toml_value(b)}" for a, b in item.items())
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(1500)
def test_two_ranks_train_checkpoint_and_resume_exactly(tmp_path: Path) -> None:
    settings = resume_settings(tmp_path)
    settings["stages"][1]["steps"] = 3
    config = tmp_path / "config.toml"
    config.write_text(to_toml(settings))
    whole = tmp_path / "whole"
    two = [*TORCHRUN, "2"]
    run_tree([*two, *CLI, "--config", str(config), "--run-dir", str(whole)], tmp_path, 600)

    lines = read_lines(whole / "metrics.jsonl")
    assert [x["step"] for x in lines] == [1, 2, 3]
    # Each rank rolled out a share of the prompts; every line has the whole step's rollouts.
    assert all(x["rollouts"] == 3 * 4 for x in lines), lines
    assert sum(not x["skipped_update"] for x in lines) >= 1, lines
    assert (whole / "rank1" / "metrics.jsonl").exists()  # rank 1 logs apart
    end = whole / "checkpoints" / "rl-end"
    assert (end / "rng.pt").exists() and (end / "rng-rank1.pt").exists()
    state = load_file(end / "model.safetensors")
    assert "model.embed_tokens.weight" in state  # the LM's own names, whole tensors
    optimizer = torch.load(end / "optimizer.pt", weights_only=True)["optimizer"]
    assert "lm.model.embed_tokens.weight" in optimizer["state"]  # by name: any world size

    # Interrupted after RL step 1, resumed on 2 ranks: the same steps, the same weights.
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    for tag in ("step-00002", "step-00003", "rl-end"):
        shutil.rmtree(cut / "checkpoints" / tag)
    (cut / "metrics.jsonl").write_text(json.dumps(lines[0]) + "\n")
    run_tree([*two, *CLI, "--resume", str(cut)], tmp_path, 600)
    again = read_lines(cut / "metrics.jsonl")
    assert [comparable(x) for x in again] == [comparable(x) for x in lines]
    mine = load_file(cut / "checkpoints" / "rl-end" / "model.safetensors")
    assert mine.keys() == state.keys()
    assert all(torch.equal(mine[k], state[k]) for k in mine)

    # A 2-rank checkpoint resumes in one process (its layout is the one-process one).
    one = tmp_path / "one"
    shutil.copytree(cut, one)
    shutil.rmtree(one / "checkpoints" / "rl-end")
    shutil.rmtree(one / "checkpoints" / "step-00003")
    (one / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:2]))
    run_tree([sys.executable, *CLI, "--resume", str(one)], tmp_path, 600)
    assert [x["step"] for x in read_lines(one / "metrics.jsonl")] == [1, 2, 3]
