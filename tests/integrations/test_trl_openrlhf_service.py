"""The TRL and OpenRLHF examples (examples/), run in a real TRL 1.16 and OpenRLHF 0.11.2.

drive_trl_openrlhf.py calls them in the trainers' environment as those trainers call them
(OpenRLHF's MultiTurnAgentExecutor.execute with a scripted engine), and trains (trl_train_step.py)
one GRPOTrainer step on a tiny model with the example's reward and environment. Here the
reports are checked and the service asked whether the sessions they ended are gone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trainer_env import REPO, run_in_trainer_env

from sandbox_service.local.private import PrivateService
from trainer_client import SyncSandboxClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def report(
    service: PrivateService,
    trainer_env: Path,
    client_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("trl-train")
    done = run_in_trainer_env(
        trainer_env,
        Path(__file__).parent / "drive_trl_openrlhf.py",
        [service.url, str(REPO / "examples"), str(out)],
        client_path,
    )
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    parsed: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return parsed


def assert_gone(service: PrivateService, session_id: str) -> None:
    with SyncSandboxClient(service.url) as client:
        assert client.end_session(session_id) is False


def test_trls_reward_function_grades_through_the_service(report: dict[str, Any]) -> None:
    assert report["trl"]["rewards"] == [1.0, 0.0, 0.0]
    assert report["trl"]["reward_is_async"] is True


def test_trls_environment_gives_each_rollout_a_session(
    report: dict[str, Any], service: PrivateService
) -> None:
    trl = report["trl"]
    schema = trl["tool_schema"]["function"]
    assert schema["name"] == "python" and schema["parameters"]["required"] == ["code"]
    assert "stdout: 42" in trl["texts"][1]
    assert "NameError" in trl["texts"][2]  # the next rollout starts empty
    first, second = trl["sessions"]
    assert first != second
    assert_gone(service, first)
    assert_gone(service, second)


def test_the_openrlhf_executor_runs_an_episode_with_one_end_of_turn_per_turn(
    report: dict[str, Any], service: PrivateService
) -> None:
    episode = report["openrlhf"]
    tokens = episode["tokens"]
    assert "<|im_end|><|im_end|>" not in tokens and "<|im_end|>\n<|im_end|>" not in tokens
    assert tokens.count("<|im_start|>") == tokens.count("<|im_end|>"), tokens
    turns = tokens.split("<|im_start|>")[1:]
    assert [t.split("\n", 1)[0] for t in turns] == [
        "system", "user", "assistant", "user", "assistant", "user", "assistant",
    ]  # fmt: skip
    assert all(t.endswith("<|im_end|>\n") or t.endswith("<|im_end|>") for t in turns), tokens
    assert "stdout: 42" in turns[5]  # the second cell saw the first cell's `v`
    assert [a.endswith("<|im_end|>") for a in episode["actions"]] == [True] * 3
    assert episode["reward"] == 1.0
    assert_gone(service, episode["session"])


def test_grpotrainer_trains_a_step_with_the_example_environment_and_reward(
    report: dict[str, Any], service: PrivateService
) -> None:
    trained = report["train"]
    print(f"\nTRL: taught in {trained['taught_s']} s, one GRPO step in {trained['trained_s']} s")
    assert trained["global_step"] == 1
    log = trained["log"]
    assert log["tools/call_frequency"] > 0 and log["tools/failure_frequency"] == 0
    assert log["rewards/correct_answer_reward/mean"] == 1.0  # graded by the service
    assert len(trained["sessions"]) == 2  # one environment per rollout slot
    for session in trained["sessions"]:
        assert_gone(service, session)
