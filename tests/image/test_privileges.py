"""The worker container's privileges: with exactly those of deploy/ a jail starts; without any
one of them the entry point refuses to start the worker and says why.

Each case runs the worker image's entry point (its cgroup and /proc preparation, then a real
test jail) with `true` as the command, the way compose runs the worker but without Redis.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.image import stack
from tests.image.stack import Stack

PROFILE = stack.ROOT / "deploy" / "seccomp" / "worker.json"
CAPABILITIES = ("SETGID", "SETUID", "SYS_ADMIN")
CAPABILITY_BITS = (1 << 6) | (1 << 7) | (1 << 21)
"""CAP_SETGID, CAP_SETUID and CAP_SYS_ADMIN, as /proc/PID/status shows capability sets."""
ENOSYS = 38
"""What the worker's profile answers a call it does not allow (podman's own profile differs)."""


def entrypoint(caps: tuple[str, ...], seccomp: str) -> subprocess.CompletedProcess[str]:
    """Run the worker image's entry point with these privileges; exit status and output."""
    argv = ["podman", "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--tmpfs", "/run"]
    argv += ["--network", "none", "--cgroupns", "private", "--cap-drop", "ALL"]
    argv += [arg for cap in caps for arg in ("--cap-add", cap)]
    argv += ["--security-opt", "apparmor=unconfined", "--security-opt", f"seccomp={seccomp}"]
    argv += ["--entrypoint", '["rl-sandbox-worker-entrypoint", "true"]']
    argv.append(f"localhost/rl-sandbox-worker:{stack.IMAGE_TAG}")
    return subprocess.run(
        argv, env=stack.podman_env(), capture_output=True, text=True, timeout=120, check=False
    )


def without_pivot_root(tmp_path: Path) -> str:
    """Our profile less pivot_root: what Docker's default seccomp profile allows nsjail."""
    profile = json.loads(PROFILE.read_text())
    for rule in profile["syscalls"]:
        rule["names"] = [name for name in rule["names"] if name != "pivot_root"]
    path = tmp_path / "no-pivot-root.json"
    path.write_text(json.dumps(profile))
    return str(path)


def test_the_documented_privileges_start_a_jail(images: dict[str, float]) -> None:
    done = entrypoint(CAPABILITIES, str(PROFILE))
    assert done.returncode == 0, done.stderr
    assert "a test jail started: ready" in done.stderr, done.stderr


@pytest.mark.parametrize("missing", CAPABILITIES)
def test_without_a_capability_the_worker_refuses_to_start(
    images: dict[str, float], missing: str
) -> None:
    done = entrypoint(tuple(c for c in CAPABILITIES if c != missing), str(PROFILE))
    assert done.returncode == 1, done.stderr
    assert "Worker privileges" in done.stderr, done.stderr
    assert "cannot" in done.stderr, done.stderr
    assert "ready" not in done.stderr, done.stderr


def test_without_pivot_root_the_worker_says_so(images: dict[str, float], tmp_path: Path) -> None:
    done = entrypoint(CAPABILITIES, without_pivot_root(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "pivot_root" in done.stderr, done.stderr
    assert "ready" not in done.stderr, done.stderr


def test_the_stack_worker_runs_with_exactly_those_privileges(compose_stack: Stack) -> None:
    (worker,) = stack.containers("worker")
    status = stack.podman("exec", worker, "cat", "/proc/1/status")
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    for capability_set in ("CapEff", "CapPrm", "CapBnd"):
        assert int(fields[capability_set], 16) == CAPABILITY_BITS, (capability_set, fields)
    assert fields["Seccomp"].strip() == "2", fields  # a seccomp filter is on
    # The filter is deploy/seccomp/worker.json, not podman's default: ptrace, which podman's
    # default allows (the kernel would then answer ESRCH for pid 0), is refused with ENOSYS.
    probe = "import ctypes; c = ctypes.CDLL(None, use_errno=True); "
    probe += "print(c.syscall(101, 2, 0, 0, 0), ctypes.get_errno())"  # ptrace(PEEKDATA, 0)
    answer = stack.podman("exec", worker, "python", "-c", probe).split()
    assert answer == ["-1", str(ENOSYS)], answer
