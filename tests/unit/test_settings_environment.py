"""A misspelled RL_SANDBOX_* variable stops start-up, naming the setting that was meant."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sandbox_service.settings import (
    Settings,
    UnknownSettingError,
    setting_env_names,
    unknown_settings,
)


def test_a_typo_names_the_closest_setting() -> None:
    messages = unknown_settings({"RL_SANDBOX_MAX_TIMEOUT_S": "120"}, setting_env_names())
    assert messages == [
        "RL_SANDBOX_MAX_TIMEOUT_S is not a setting; did you mean RL_SANDBOX_MAX_TIMEOUT?"
    ]


def test_known_names_and_other_prefixes_pass() -> None:
    environ = {"RL_SANDBOX_WORKERS": "2", "rl_sandbox_port": "1", "REDIS_URL": "x", "HOME": "/"}
    assert unknown_settings(environ, setting_env_names()) == []


def test_a_name_far_from_every_setting_gets_no_guess() -> None:
    (message,) = unknown_settings({"RL_SANDBOX_ZZZZZZZZZZZZ": "1"}, setting_env_names())
    assert message == "RL_SANDBOX_ZZZZZZZZZZZZ is not a setting"


def test_settings_refuse_an_unknown_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RL_SANDBOX_WORKER", "3")
    with pytest.raises(UnknownSettingError, match="did you mean RL_SANDBOX_WORKERS"):
        Settings()


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "sandbox_service.cli", "api"],
        [sys.executable, "-m", "sandbox_service.worker.main", "--slot", "0"],
    ],
)
def test_startup_stops_with_the_message(command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_SANDBOX_")}
    env["RL_SANDBOX_MAX_TIMEOUT_S"] = "120"
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "RL_SANDBOX_MAX_TIMEOUT_S is not a setting" in proc.stderr
    assert "did you mean RL_SANDBOX_MAX_TIMEOUT?" in proc.stderr
