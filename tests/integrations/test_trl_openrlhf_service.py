"""The TRL and OpenRLHF examples (examples/), run in a real TRL 1.16 and OpenRLHF 0.11.2.

drive_trl_openrlhf.py calls them in the trainers' environment as those trainers call them;
here the report is checked and the service asked whether the sessions they ended are gone.
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
def report(service: PrivateService, trainer_env: Path, client_path: Path) -> dict[str, Any]:
    done = run_in_trainer_env(
        trainer_env,
        Path(__file__).parent / "drive_trl_openrlhf.py",
        [service.url, str(REPO / "examples")],
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


def test_the_openrlhf_agent_runs_cells_and_rewards_the_answer(
    report: dict[str, Any], service: PrivateService
) -> None:
    episode = report["openrlhf"]
    assert episode["observation"] == "What is 6 * 7?"
    assert episode["done"] == [False, False, True]
    assert "<tool_response>" in episode["feedback"][0]
    assert "stdout: 42" in episode["feedback"][1]
    assert episode["rewards"] == [0.0, 0.0, 1.0]
    assert_gone(service, episode["session"])
