"""`train()` end to end on a toy run: SFT, one GRPO-RoC step against a real sandbox, outputs."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rl.run.build import load_tokenizer
from rl.run.evaluate import EvalSettings, evaluate
from rl.run.local_service import LocalService
from rl.run.train_config import TrainConfig, config_from_dict
from rl.run.trainer import train, train_command

pytestmark = pytest.mark.slow


def test_a_toy_run_writes_metrics_checkpoints_and_plot(
    sandbox: LocalService, tmp_path: Path
) -> None:
    config = config_from_dict(
        {
            "name": "toy",
            "device": "cpu",
            "sandbox": {"url": sandbox.url},
            "model": {
                "hidden_size": 32,
                "num_layers": 1,
                "num_heads": 2,
                "intermediate_size": 64,
                "vocab_size": 300,
            },
            "task": {
                "num_problems": 40,
                "min_digits": 2,
                "max_digits": 2,
                "sft_tool_fraction": 0.5,
            },
            "template": {"system": "Use the tool.", "user_prefix": "", "include_tools": False},
            "rollout": {"engines": [{"capacity_tokens": 4096}, {"capacity_tokens": 1024}]},
            "trainer": {"checkpoint_every": 1, "keep_checkpoints": 1},
            "grpo": {
                "group_size": 2,
                "oversample": 2,
                "min_pos": 1,
                "min_neg": 1,
                "prompts_per_step": 2,
                "max_turns": 2,
                "max_response_tokens": 48,
                "verify_workers": 1,
            },
            "stages": [
                {"name": "sft", "kind": "sft", "steps": 2, "batch_size": 4, "learning_rate": 1e-3},
                {"name": "rl", "kind": "grpo", "steps": 2, "learning_rate": 1e-4},
            ],
        }
    )
    out = train(config, run_dir=tmp_path / "toy", progress=False, config_text="# toy\n")
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert line["rollouts"] == 2 * 4  # prompts_per_step x 2G
        assert 0.0 <= line["reward_mean"] <= 1.0
        for key in (
            "accuracy",
            "tool_error_ratio_pos",
            "response_len_mean",
            "roc_kept",
            "time_rollout_s",
            "engines",
        ):
            assert key in line
        assert set(line["engines"]) == {"transformers0", "transformers1"}
    assert len((out / "sft.jsonl").read_text().splitlines()) == 2
    # Pruning keeps the newest periodic checkpoint and every stage's end (it deleted sft-end).
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "rl-end",
        "sft-end",
        "step-00002",
    ]
    assert (out / "checkpoints" / "rl-end" / "optimizer.pt").exists()
    assert (out / "checkpoints" / "sft-end" / "config.json").exists()
    assert (out / "metrics.png").stat().st_size > 0
    assert (out / "config.toml").read_text() == "# toy\n"
    # A checkpoint reloads with the tokenizer it was trained with (numbers split the same way).
    from transformers import AutoTokenizer

    text = "stdout: 4517277\n<answer>\\boxed{4517277}</answer>"
    reloaded = load_tokenizer(str(out / "checkpoints" / "rl-end"), AutoTokenizer)
    original = load_tokenizer(str(out / "tokenizer"), AutoTokenizer)
    assert reloaded.encode(text) == original.encode(text)
    # rl-sandbox eval on the final checkpoint: k samples of each problem, one line per problem.
    summary = evaluate(
        config,
        tmp_path / "eval",
        EvalSettings(samples=3, temperature=0.6, limit=4),
        checkpoint=str(out / "checkpoints" / "rl-end"),
    )
    results = read_lines(tmp_path / "eval" / "results.jsonl")
    assert [r["index"] for r in results] == [0, 1, 2, 3]
    assert all(len(r["correct"]) == 3 and set(r["correct"]) <= {0.0, 1.0} for r in results)
    assert summary["pass@1"] == pytest.approx(sum(r["pass@1"] for r in results) / 4)
    assert (summary["problems"], summary["samples_per_problem"]) == (4, 3)
    assert json.loads((tmp_path / "eval" / "summary.json").read_text()) == summary


def test_the_cli_offers_train_resume_and_eval(capsys: pytest.CaptureFixture[str]) -> None:
    from sandbox_service.cli import main

    for argv in (["train", "--help"], ["eval", "--help"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--resume RUN" in out and "--samples" in out and "--temperature" in out


# Nothing listens on the discard port: a tool call would come back as a sandbox_error record.
NO_SANDBOX = "http://127.0.0.1:9"


def resume_config(tmp_path: Path) -> TrainConfig:
    return config_from_dict(resume_settings(tmp_path))


def resume_settings(tmp_path: Path) -> dict[str, Any]:
    # One turn per rollout and no tool in the demonstrations: no tool call is run, so every
    # rollout of a step is prefilled in one cohort and the run is a function of its seeds (tool
    # latencies would reshape the cohorts). So no sandbox either.
    rng = random.Random(0)
    problems, demos = tmp_path / "problems.jsonl", tmp_path / "demos.jsonl"
    numbers = [rng.randrange(10, 100) for _ in range(40)]
    problems.write_text(
        "".join(json.dumps({"question": f"Is {n} odd?", "answer": n % 2}) + "\n" for n in numbers)
    )
    turns = [
        f"I know this one.</reason><answer>\\boxed{{{rng.randrange(2)}}}</answer>" for _ in numbers
    ]
    demos.write_text(
        "".join(
            json.dumps({"question": f"Is {n} odd?", "turns": [t]}) + "\n"
            for n, t in zip(numbers, turns, strict=True)
        )
    )
    return {
        "name": "resume",
        "device": "cpu",
        "plot": False,
        "sandbox": {"url": NO_SANDBOX},
        "reward": {"verifier": "local"},  # no sandbox to grade through
        "model": {
            "hidden_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_size": 128,
            "vocab_size": 400,
        },
        # Parities answered directly, with demonstrations that answer 0 or 1 at random: the
        # policy guesses, so groups hold both rewards and the steps do update.
        "task": {"kind": "jsonl", "train_file": str(problems), "sft_file": str(demos)},
        "template": {"system": "Use the tool.", "user_prefix": "", "include_tools": False},
        "rollout": {"engines": [{"capacity_tokens": 8192}]},
        "trainer": {"checkpoint_every": 1, "keep_checkpoints": 10, "minibatches": 2},
        "grpo": {
            "group_size": 2,
            "oversample": 2,
            "min_pos": 0,
            "min_neg": 0,
            "prompts_per_step": 3,
            "max_turns": 1,
            "max_response_tokens": 40,
            "verify_workers": 1,
            "learning_rate": 1e-3,
        },
        "stages": [
            {"name": "sft", "kind": "sft", "steps": 60, "batch_size": 8, "learning_rate": 1e-2},
            {"name": "rl", "kind": "grpo", "steps": 4, "warmup_steps": 3},
        ],
    }


FLOAT_NOISE = ("logprob_mismatch",)
"""The engine's sampling log-probs against the trainer's recomputation: about 1e-7 of float
rounding that depends on how the engine batched its sequences, not on the run's state."""


def comparable(line: dict[str, Any]) -> dict[str, Any]:
    """A metrics line less what depends on the clock or on float rounding alone."""
    return {
        k: v
        for k, v in line.items()
        if not k.startswith("time_") and k not in ("engines", *FLOAT_NOISE)
    }


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_a_resumed_run_goes_on_exactly_as_the_uninterrupted_one(tmp_path: Path) -> None:
    config = resume_config(tmp_path)
    whole = train(config, run_dir=tmp_path / "whole", progress=False, config_text="# r\n")
    # Interrupted after RL step 2: its later checkpoints never written, step 3's line written.
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    for tag in ("step-00003", "step-00004", "rl-end"):
        shutil.rmtree(cut / "checkpoints" / tag)
    kept = read_lines(cut / "metrics.jsonl")[:3]
    (cut / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in kept))
    train(config, run_dir=cut, progress=False, resume=True)

    a, b = read_lines(whole / "metrics.jsonl"), read_lines(cut / "metrics.jsonl")
    assert [x["step"] for x in b] == [1, 2, 3, 4]
    for whole_line, resumed_line in zip(a, b, strict=True):
        x, y = comparable(whole_line), comparable(resumed_line)
        differ = {k: (x.get(k), y.get(k)) for k in x.keys() | y.keys() if x.get(k) != y.get(k)}
        assert not differ, (x["step"], differ)
        for key in FLOAT_NOISE:
            assert resumed_line[key] == pytest.approx(whole_line[key], rel=0.2, abs=1e-7), key
    assert sum(not x["skipped_update"] for x in a[2:]) >= 1, a  # the resumed steps update
    assert all(x["tool_calls_per_rollout"] == 0 for x in a)
    assert read_lines(whole / "sft.jsonl") == read_lines(cut / "sft.jsonl")
    for tag in ("step-00003", "rl-end"):
        mine = load_file(cut / "checkpoints" / tag / "model.safetensors")
        theirs = load_file(whole / "checkpoints" / tag / "model.safetensors")
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), tag
        assert json.loads((cut / "checkpoints" / tag / "state.json").read_text()) == json.loads(
            (whole / "checkpoints" / tag / "state.json").read_text()
        )


def test_resume_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.toml").write_text(
        'name = "x"\n[[stages]]\nname = "rl"\nkind = "grpo"\n'
    )
    assert train_command(None, resume=str(tmp_path / "empty"), progress=False) == 2
