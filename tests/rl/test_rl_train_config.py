"""Run configuration files: the shipped ones load; mistakes are named with their place."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from rl.parallel.distributed import COLLECTIVE_TIMEOUT_S
from rl.run.train_config import (
    TRANSFORMERS_CAPACITY_TOKENS,
    ConfigError,
    config_from_dict,
    load_config,
)
from sandbox_service.cli import main

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def minimal(**top: Any) -> dict[str, Any]:
    return {"name": "t", "stages": [{"name": "rl", "kind": "grpo", "steps": 2}], **top}


def valid(**top: Any) -> dict[str, Any]:
    """A minimal configuration that passes every check."""
    return minimal(grpo={"max_response_tokens": 256}, **top)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_shipped_configs_are_valid(path: Path) -> None:
    config = load_config(path)
    assert config.stages


def test_demo_config_is_sft_then_grpo_with_2g_rollouts() -> None:
    config = load_config(CONFIGS / "demo-rl.toml")
    assert [s.kind for s in config.stages] == ["sft", "grpo"]
    assert config.grpo.rollouts_per_prompt == 2 * config.grpo.group_size
    assert config.device == "cpu" and config.model.source == "tiny"


def test_stage_overrides_apply_to_grpo() -> None:
    raw = minimal(grpo={"max_turns": 10, "max_response_tokens": 100})
    raw["stages"][0].update({"max_turns": 15, "learning_rate": 2e-6, "reset_optimizer": True})
    config = config_from_dict(raw)
    grpo = config.stage_grpo(config.stages[0])
    assert (grpo.max_turns, grpo.max_response_tokens, grpo.learning_rate) == (15, 100, 2e-6)


def test_a_vllm_engine_asks_vllm_for_its_capacity_unless_one_is_configured() -> None:
    engines = config_from_dict(
        valid(rollout={"engines": [{"kind": "vllm"}, {"kind": "transformers"}]})
    ).rollout.engines
    assert [e.capacity_tokens for e in engines] == [0, 0]  # 0: the engine's own
    assert TRANSFORMERS_CAPACITY_TOKENS == 65536


def test_collectives_wait_hours_for_the_slowest_rank_by_default() -> None:
    assert config_from_dict(valid()).trainer.collective_timeout_s >= 3600
    assert COLLECTIVE_TIMEOUT_S >= 3600
    raw = valid(trainer={"collective_timeout_s": 86400})
    assert config_from_dict(raw).trainer.collective_timeout_s == 86400


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"stages": [{"name": "a", "stpes": 3}]}, "stages[0]: unknown key 'stpes'"),
        ({"stages": [{"name": "a", "steps": "3"}]}, "stages[0].steps: expected an integer"),
        ({"stages": [{"name": "a", "steps": 0}]}, "stages[0] (a).steps: must be at least 1"),
        ({"stages": [{"name": "a", "kind": "ppo"}]}, "stages[0].kind: 'ppo' is not one of"),
        ({"stages": [{"steps": 3}]}, "stages[0].name: required"),
        ({"stages": []}, "at least one [[stages]]"),
        ({"grpo": {"min_pos": 9, "min_neg": 9}}, "grpo: need 0 <= min_pos"),
        ({"grpo": {"group_size": 1.5}}, "grpo.group_size: expected an integer"),
        ({"model": {"source": "pretrained"}}, "model.path: required"),
        ({"modle": {}}, "top level: unknown key 'modle'"),
        ({"rollout": {"engines": [{"kind": "sglang"}]}}, "rollout.engines[0].kind"),
        (
            {"grpo": {"max_response_tokens": 600}, "model": {"max_positions": 512}},
            "does not leave room for the prompt",
        ),
        ({"task": {"kind": "jsonl"}}, "task.train_file: required"),
        ({"grpo": {"answer_kind": "tests"}}, "grpo.answer_kind: 'tests' is not one of"),
        (
            {"grpo": {"answer_kind": "code"}, "reward": {"verifier": "local"}},
            'grpo.answer_kind = "code" is graded by the service',
        ),
        ({"trainer": {"collective_timeout_s": 0}}, "collective_timeout_s must be positive"),
        (
            {"rollout": {"engines": [{"kind": "vllm", "placement": "separate"}]}},
            'placement: "separate" is for vllm engines, with engine_devices',
        ),
        (
            {"rollout": {"engines": [{"kind": "vllm", "engine_devices": "1"}]}},
            "engine_devices: only with placement",
        ),
        (
            {"rollout": {"engines": [{"kind": "vllm", "capacity_tokens": -1}]}},
            "capacity_tokens: must be 0 or positive",
        ),
        (
            {"stages": [{"name": "a", "kind": "sft", "lr_schedule": "linear"}]},
            "stages[0].lr_schedule: 'linear' is not one of",
        ),
        (
            {"stages": [{"name": "a", "kind": "sft", "steps": 5, "decay_steps": 6}]},
            "stages[0] (a).decay_steps: must be between 0 and steps (5)",
        ),
        (
            {"stages": [{"name": "a", "kind": "sft", "steps": 5, "decay_steps": 2}]},
            'decay_steps: only with lr_schedule = "constant"',
        ),
    ],
)
def test_mistakes_are_named(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(minimal(**change), source="run.toml")
    assert message in str(caught.value)
    assert str(caught.value).startswith("run.toml: ")


def test_unreadable_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_cli_reports_a_bad_config_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.toml"
    path.write_text('name = "x"\n[[stages]]\nname = "a"\nsteps = -1\n')
    assert tomllib.loads(path.read_text())
    assert main(["train", "--config", str(path)]) == 2
    assert "stages[0] (a).steps: must be at least 1" in capsys.readouterr().out
