"""Our verl tools and reward inside a real verl install, against the real service.

verl runs in the trainers' environment (trainer_env.py: verl 0.9.1 from the package index, our
client from this checkout); drive_verl.py builds the tools with verl's registry from
examples/verl and calls them through verl's ToolAgentLoop._call_tool; then (verl_loop.py) it runs
whole trajectories through ToolAgentLoop.run (verl's plain `tool_agent` and our
`rl_sandbox_tool_agent`, built as verl's agent-loop worker builds them, a scripted model) and a
batch through verl's RewardLoopWorker with our compute_score. Here the service is asked
afterwards whether each session the tools opened is gone.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from trainer_env import REPO, run_in_trainer_env

from sandbox_service.local.private import PrivateService
from trainer_client import SyncSandboxClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

HERE = Path(__file__).parent
EXAMPLES = REPO / "examples" / "verl"


def last_json_line(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


@pytest.fixture(scope="module")
def verl_report(
    service: PrivateService,
    trainer_env: Path,
    client_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    args = [service.url, str(EXAMPLES), str(tmp_path_factory.mktemp("verl-loop"))]
    done = run_in_trainer_env(trainer_env, HERE / "drive_verl.py", args, client_path)
    return last_json_line(done)


def assert_gone(service: PrivateService, session_id: str, name: str) -> None:
    """The service no longer has the session: nothing to end, and its variables are gone."""
    with SyncSandboxClient(service.url) as client:
        assert client.end_session(session_id) is False
        fresh = client.execute(name, session_id=session_id)
        assert fresh.error is not None and fresh.error.ename == "NameError"
        client.end_session(session_id)


def test_a_tool_instance_reaches_a_session_and_release_ends_it(
    verl_report: dict[str, Any], service: PrivateService
) -> None:
    instance = verl_report["instance"]
    assert instance["texts"][0].startswith("Tool call success")
    assert "stdout: 42" in instance["texts"][1]
    assert_gone(service, instance["session"], "x")


def test_a_trajectory_shares_one_session_that_its_scope_ends(
    verl_report: dict[str, Any], service: PrivateService
) -> None:
    trajectory = verl_report["trajectory"]
    assert "stdout: 42" in trajectory["texts"][1] and "stdout: 7" in trajectory["texts"][2]
    (session,) = trajectory["sessions"]
    assert_gone(service, session, "y")
    # Without a scope, calls of two trajectories (two AgentData) share no session.
    assert "Tool call success" in verl_report["unscoped"][0]
    assert "NameError" in verl_report["unscoped"][1]


def test_the_stateless_tool_and_the_schemas(verl_report: dict[str, Any]) -> None:
    assert "stdout: cba" in verl_report["stateless"]
    assert "'code' must be a string" in verl_report["bad_arguments"]
    assert verl_report["names"] == ["python_code_with_standard_io", "jupyter_code"]
    code_schema, session_schema = verl_report["schemas"]
    assert code_schema["function"]["parameters"]["required"] == ["code", "input"]
    assert session_schema["function"]["parameters"]["properties"]["code"]["type"] == "string"
    assert verl_report["agent_loop"] == {
        "_target_": "trainer_client.integrations.verl.SandboxToolAgentLoop"
    }


def test_the_reward_grades_through_the_service(verl_report: dict[str, Any]) -> None:
    assert verl_report["scores"] == [1.0, 0.0, 0.0, 1.0]
    assert verl_report["batch_scores"] == [1.0, 0.0, 0.0, 1.0]


def test_everything_closed_without_a_resource_warning(verl_report: dict[str, Any]) -> None:
    # The driver turns ResourceWarning into an error (it would have failed), and counts sockets.
    assert verl_report["sockets_after"] <= verl_report["sockets_before"]


def test_the_trainer_flags_name_verls_own_settings(trainer_env: Path, client_path: Path) -> None:
    script = (EXAMPLES / "run_grpo.sh").read_text()
    overrides = re.findall(r"^\s+(\+?[a-z_.]+)=", script, flags=re.MULTILINE)
    assert "reward.custom_reward_function.path" in overrides
    done = run_in_trainer_env(
        trainer_env, HERE / "probe_verl_flags.py", [json.dumps(overrides)], client_path
    )
    assert last_json_line_list(done) == []
    for name in ("session_tool_config.yaml", "agent_loop_config.yaml"):
        assert name in script and (EXAMPLES / name).exists()


def last_json_line_list(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    missing: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return missing


@pytest.fixture(scope="module")
def loop_report(verl_report: dict[str, Any]) -> dict[str, Any]:
    loop: dict[str, Any] = verl_report["loop"]
    return loop


@pytest.mark.parametrize("agent", ["tool_agent", "rl_sandbox_tool_agent"])
def test_a_trajectory_through_toolagentloop_run_keeps_its_interpreter(
    loop_report: dict[str, Any], service: PrivateService, agent: str
) -> None:
    trajectory = loop_report[agent]
    text = trajectory["response"]
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)
    assert len(responses) == 2, trajectory["response"]
    assert responses[0].startswith("Tool call success")
    assert "stdout: 42" in responses[1]  # `v` set by the first call, printed by the second
    assert trajectory["response"].endswith("\\boxed{42}.<|im_end|>")
    (ended,) = trajectory["ended"]
    assert_gone(service, ended, "v")
    if agent == "tool_agent":  # freed with verl's AgentData when run returned
        assert trajectory["sessions"] == [ended]


def test_verls_reward_loop_loads_and_awaits_our_compute_score(loop_report: dict[str, Any]) -> None:
    assert loop_report["reward_manager"] == "NaiveRewardManager"
    assert loop_report["reward_scores"] == [1.0, 0.0, 0.0, 1.0]
