"""A trainer's environment for the integration tests: verl, TRL and OpenRLHF, with our client.

Built once by uv into ~/.cache/rl-sandbox (keyed by the requirements below; uv's package cache
makes a rebuild a few seconds, a first build downloads PyTorch), apart from the project's own
environment so that the trainers' pins (transformers, numpy) never touch it. The client comes
from this checkout and nothing else of it: PYTHONPATH names a folder that holds only a link to
trainer_client/, and the environment holds httpx and pydantic as the light install does.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.cached_env import REPO, cached_python

REQUIREMENTS = (
    "verl==0.9.1",
    "trl==1.16.0",
    # verl's agent loop imports these without declaring them
    "cachetools",
    "fastapi",
    "uvicorn",
    # transformers' chat-template tool-call parsing (TRL's environment_factory) imports it;
    # the transformers verl pins does not declare it
    "jmespath",
    # the client's own dependencies (clients/python)
    "httpx>=0.27",
    "pydantic>=2.7",
    # what openrlhf.utils.agent imports; OpenRLHF itself comes without its dependencies
    # (DeepSpeed, vLLM, flash-attn: GPU builds), since only its agent interface is used
    "aiohttp",
    "pylatexenc",
)
NO_DEPS = ("openrlhf==0.11.2",)


def trainer_python() -> Path:
    """The interpreter of the trainers' environment, built on first use."""
    return cached_python("trainer", REQUIREMENTS, NO_DEPS)


def client_only_path(folder: Path) -> Path:
    """A folder whose only entry links to this checkout's trainer_client (for PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "trainer_client"
    if not link.exists():
        link.symlink_to(REPO / "trainer_client", target_is_directory=True)
    return folder


def run_in_trainer_env(
    python: Path, script: Path, args: list[str], client_path: Path, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run a script of tests/integrations in the trainers' environment."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RL_SANDBOX_", "PYTHON", "VIRTUAL_ENV"))
    }
    env["PYTHONPATH"] = str(client_path)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [str(python), str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=client_path,
    )
