"""Our verl tools and reward inside a real verl install, against the real service.

verl runs in the trainers' environment (trainer_env.py: verl 0.9.1 from the package index, our
client from this checkout); drive_verl.py builds the tools with verl's registry from
examples/verl and calls them through verl's ToolAgentLoop._call_tool. Here the service is asked
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
def verl_report(service: PrivateService, trainer_env: Path, client_path: Path) -> dict[str, Any]:
    done = run_in_trainer_env(
        trainer_env, HERE / "drive_verl.py", [service.url, str(EXAMPLES)], client_path
    )
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
    # Without a scope, verl's per-call create/release gives each call a session of its own.
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
