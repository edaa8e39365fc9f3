"""Client environments for the peer-wire acceptance tests: each peer's own SDK installed as a user
installs it, by uv from the registry, into a small venv cached under ~/.cache/rl-sandbox (keyed by
its requirements; uv's package cache makes a rebuild seconds). Nothing of this checkout is in
them: the drivers (tests/compat/drivers/) talk to the service over HTTP only.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.cached_env import cached_python

DRIVERS = Path(__file__).resolve().parent / "drivers"
E2B_REQUIREMENTS = ("e2b-code-interpreter>=2.9", "e2b>=2.6")
E2B_OLDEST = ("e2b-code-interpreter==2.9.0", "e2b==2.26.0")
"""The first code interpreter that sends run_code to E2B_SANDBOX_URL, with the oldest e2b it
accepts (which still insists on an `e2b_<hex>` key)."""
MCP_REQUIREMENTS = ("mcp>=1.20,<2",)
"""The client most MCP consumers install today (vLLM, open-instruct); the server is mcp 2.x."""
SANDBOXFUSION_PEERS = ("aiohttp", "numpy", "chz", "requests")
"""What tinker-cookbook's code-grading path and skyrl-agent's SandboxFusion helper import; the
packages themselves come without their dependencies (tinker, litellm, torch...), which those
paths never touch."""
SANDBOXFUSION_PEERS_NO_DEPS = ("tinker-cookbook==0.6.1", "skyrl==0.4.0")


def client_python(name: str, requirements: tuple[str, ...], no_deps: tuple[str, ...] = ()) -> Path:
    """The interpreter of the cached client environment `name`, built on first use."""
    return cached_python(name, requirements, no_deps)


def run_driver(
    python: Path, driver: str, env: dict[str, str], timeout_s: float = 300
) -> dict[str, Any]:
    """Run a driver script in a client environment; the JSON object it prints last."""
    clean = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RL_SANDBOX_", "PYTHON", "VIRTUAL_ENV", "E2B_"))
    }
    done = subprocess.run(
        [str(python), str(DRIVERS / driver)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**clean, **env, "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=DRIVERS,
    )
    assert done.returncode == 0, f"{driver} failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report
