"""`train()` end to end on a toy run: SFT, one GRPO-RoC step against a real sandbox, outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rl.run.local_service import LocalService
from rl.run.train_config import config_from_dict
from rl.run.build import load_tokenizer
from rl.run.trainer import train

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
