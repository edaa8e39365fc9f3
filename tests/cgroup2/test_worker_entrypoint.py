"""deploy/worker-entrypoint.sh on cgroup v2, in a cgroup and mount namespace made to look like a
container's: the container's cgroup is the namespace's root, holds its processes, and is mounted
read-only. The entry point must make it writable, move the processes to a leaf, let the worker's
own delegation give `<parent>` memory, pids and cpu, and start a test jail."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sandbox_service.jail.cgroups import CGROUP_ROOT, is_v2

ENTRYPOINT = Path(__file__).resolve().parents[2] / "deploy" / "worker-entrypoint.sh"
PARENT = "rl-sandbox-ep"


@pytest.fixture
def container_cgroup() -> Path:
    if not is_v2():
        pytest.skip("the cgroup v1 branch was tried by hand (docs/deploy.md, 'Worker privileges')")
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux)")
    # What a container runtime does before it starts the container: a cgroup of its own, with
    # the controllers handed down to it.
    (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory +pids +cpu")
    cgroup = CGROUP_ROOT / f"container-{os.getpid()}"
    cgroup.mkdir()
    return cgroup


def remove_tree(cgroup: Path) -> None:
    for child in sorted(cgroup.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if child.is_dir():
            child.rmdir()
    cgroup.rmdir()


def test_entrypoint_delegates_and_starts_a_jail(container_cgroup: Path) -> None:
    inside = (
        "umount /sys/fs/cgroup && mount -t cgroup2 -o ro cgroup2 /sys/fs/cgroup && "
        f"exec {ENTRYPOINT} sh -c 'cat /proc/self/cgroup; "
        f"cat /sys/fs/cgroup/{PARENT}/cgroup.subtree_control'"
    )
    script = (
        f"echo $$ > {container_cgroup}/cgroup.procs && "
        f'exec unshare --cgroup --mount --propagation private sh -c "{inside}"'
    )
    env = {**os.environ, "RL_SANDBOX_CGROUP_PARENT": PARENT}
    try:
        done = subprocess.run(
            ["sh", "-c", script], env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
        assert f"cgroup v2: jails go under /sys/fs/cgroup/{PARENT} (cpu memory pids)" in done.stderr
        assert "a test jail started: ready" in done.stderr
        own_cgroup, delegated = done.stdout.splitlines()
        assert own_cgroup == "0::/supervisor"  # moved to the leaf, seen from inside
        assert set(delegated.split()) >= {"cpu", "memory", "pids"}
        # The host's view: the container's subtree only.
        host_view = container_cgroup / PARENT / "cgroup.subtree_control"
        assert set(host_view.read_text().split()) >= {"cpu", "memory", "pids"}
    finally:
        remove_tree(container_cgroup)
