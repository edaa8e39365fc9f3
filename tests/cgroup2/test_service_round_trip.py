"""`rl-sandbox up` (what `make run` runs) on this host, then POST /execute: print and sympy.

On cgroup v2 nothing is delegated to the service beforehand: it creates its parent cgroup and
enables memory, pids and cpu there itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from sandbox_service.jail.cgroups import CGROUP_ROOT
from sandbox_service.local import procs
from tests.service.stack import stack_env, tail

PARENT = "rl-sandbox-cg2svc"
READY_TIMEOUT_S = 600.0  # the v2 guest runs under software emulation, 10-70x slower
CALL_TIMEOUT_S = 300.0


def rl_sandbox() -> str:
    """The `rl-sandbox` command of this interpreter's environment."""
    return str(Path(sys.executable).parent / "rl-sandbox")


def test_up_serves_print_and_sympy(tmp_path: Path, hierarchy: str) -> None:
    env = stack_env("unused", "cg2", 63300, workers=1, cgroup_parent=PARENT)
    # The guest's own start timeout for jails (make test-cgroup2 sets it), which stack_env drops.
    if start_timeout := os.environ.get("RL_SANDBOX_JAIL_START_TIMEOUT_S"):
        env["RL_SANDBOX_JAIL_START_TIMEOUT_S"] = start_timeout
    del env["RL_SANDBOX_REDIS_URL"]  # `up` starts its own Redis
    port = procs.free_port()
    log = tmp_path / "up.log"
    with log.open("ab") as out:
        up = subprocess.Popen(
            [rl_sandbox(), "up", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    seconds: dict[str, float] = {}
    started = time.monotonic()
    try:
        try:
            procs.wait_ready(url, READY_TIMEOUT_S, up)
        except procs.NotReady as exc:
            raise AssertionError(f"{exc}:\n{tail(log)}") from exc
        seconds["ready"] = time.monotonic() - started
        with httpx.Client(base_url=url, timeout=CALL_TIMEOUT_S) as client:
            printed = client.post("/execute", json={"code": "print(6 * 7)"}).json()
            assert (printed["status"], printed["stdout"]) == ("ok", "42\n"), printed
            seconds["print"] = time.monotonic() - started - sum(seconds.values())
            solved = client.post(
                "/execute",
                json={
                    "code": "import sympy\nx = sympy.Symbol('x')\nprint(sympy.solve(x**2 - 4, x))"
                },
            ).json()
            assert (solved["status"], solved["stdout"]) == ("ok", "[-2, 2]\n"), solved
            seconds["sympy"] = time.monotonic() - started - sum(seconds.values())
        # What a new user sees: the address at once, then `ready` once /readyz answers.
        # `up` polls /readyz on its own every 0.2 s, so its line may come after the calls above.
        said = _log_once_it_says(log, "rl-sandbox: ready on", READY_TIMEOUT_S)
        assert "rl-sandbox: starting the API" in said and "rl-sandbox: ready on" in said, said
        slots = [p for p in (cgroup_dirs(hierarchy)[0]).iterdir() if p.is_dir()]
        assert slots, "no slot cgroup under the service's parent"
        if hierarchy == "v2":
            delegated = (CGROUP_ROOT / PARENT / "cgroup.subtree_control").read_text().split()
            assert {"memory", "pids", "cpu"} <= set(delegated)
        os.kill(up.pid, signal.SIGTERM)
        assert up.wait(timeout=CALL_TIMEOUT_S) == 0, tail(log)
        seconds["stop"] = time.monotonic() - started - sum(seconds.values())
        print("rl-sandbox up, seconds:", {k: round(v, 1) for k, v in seconds.items()})
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    left = [
        p for base in cgroup_dirs(hierarchy) if base.is_dir() for p in base.iterdir() if p.is_dir()
    ]
    assert left == [], f"slot cgroups left behind: {left}"


def cgroup_dirs(hierarchy: str) -> list[Path]:
    """Where the service's slot cgroups live: one tree (v2) or one per controller (v1)."""
    if hierarchy == "v2":
        return [CGROUP_ROOT / PARENT]
    return [CGROUP_ROOT / c / PARENT for c in ("memory", "pids")]


def _log_once_it_says(log: Path, line: str, timeout_s: float) -> str:
    """The log's text once it holds `line`, or as it stands after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    said = log.read_text()
    while line not in said and time.monotonic() < deadline:
        time.sleep(0.1)
        said = log.read_text()
    return said
