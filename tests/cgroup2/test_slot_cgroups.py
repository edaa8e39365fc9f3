"""SlotCgroups on the real kernel, without a jail: delegation, CPU, memory and pids limits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_service.jail.cgroups import CGROUP_ROOT, CgroupUnavailable, SlotCgroups, is_v2

PARENT = "rl-sandbox-cg2test"


@pytest.fixture
def slot() -> Iterator[SlotCgroups]:
    cgroups = SlotCgroups(PARENT, f"probe-{os.getpid()}")
    cgroups.create()
    yield cgroups
    cgroups.destroy()
    assert all(not path.exists() for path in cgroups.dirs.values())


def run_in(cgroups: SlotCgroups, code: str, timeout_s: float = 120) -> tuple[int, str]:
    """Run Python code in the slot's cgroups: (exit status, stdout). The child waits on stdin
    until it has been moved in."""
    with subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.stdin.read(1)\n{code}"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    ) as child:  # fmt: skip
        cgroups.add_process(child.pid)  # the slot's (v1: its cpu hierarchy too)
        cgroups.add_run_process(child.pid)  # the run's limits, as a standby moves itself
        out, _ = child.communicate(b"x", timeout=timeout_s)
    return child.returncode, out.decode()


def test_the_parent_delegates_memory_pids_and_cpu(slot: SlotCgroups, hierarchy: str) -> None:
    if hierarchy == "v2":
        parent = CGROUP_ROOT / PARENT
        assert {"memory", "pids", "cpu"} <= set(
            (parent / "cgroup.subtree_control").read_text().split()
        )
        names = {p.name for p in slot.dirs["unified"].iterdir()}
        assert {"memory.max", "pids.max", "cpu.max"} <= names
    else:
        assert set(slot.dirs) == {"memory", "pids", "cpu"}


def test_cpu_limit_throttles_a_spinner(slot: SlotCgroups) -> None:
    slot.set_cpu_limit(0.2)
    if is_v2():
        assert (slot.dirs["unified"] / "cpu.max").read_text().split() == ["20000", "100000"]
    else:
        assert (slot.dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "20000"
        assert (slot.dirs["cpu"] / "cpu.cfs_period_us").read_text().strip() == "100000"
    started = time.monotonic()
    status, _ = run_in(
        slot, "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 2: pass"
    )
    assert status == 0
    throttling = slot.cpu_throttling()
    print(f"2 s spin under 0.2 cores: wall {time.monotonic() - started:.2f} s, {throttling}")
    # A spinner wants a whole core: it meets its quota in (nearly) every period it runs.
    assert throttling.throttled_periods > 0
    assert throttling.throttled_us > 0
    slot.set_cpu_limit(None)
    if is_v2():
        assert (slot.dirs["unified"] / "cpu.max").read_text().split()[0] == "max"
    else:
        assert (slot.dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip() == "-1"


def test_memory_limit_kills_the_allocator(slot: SlotCgroups) -> None:
    slot.prepare_execution(memory_mb=64, max_processes=16)
    status, _ = run_in(slot, "b = []\nwhile True: b.append(b'x' * (8 << 20))")
    assert status == -9
    assert slot.usage().oom_killed


def test_pids_limit_refuses_a_fork(slot: SlotCgroups) -> None:
    slot.prepare_execution(memory_mb=256, max_processes=4)
    status, out = run_in(
        slot,
        "import os, time\nn = 0\ntry:\n"
        "    for _ in range(40):\n"
        "        if os.fork() == 0:\n            time.sleep(2); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n    print(n, e.errno)",
    )
    assert status == 0
    started, errno_seen = out.split()
    # max_processes 4 in the run's cgroup (the zygote has its own): the parent and 3 children.
    assert (int(started), int(errno_seen)) == (3, 11)


def test_a_parent_that_holds_processes_is_refused_with_the_fix(hierarchy: str) -> None:
    if hierarchy != "v2":
        pytest.skip("the no-internal-processes rule is cgroup v2's")
    # This test's own cgroup holds processes (this one): it cannot delegate controllers.
    own = Path("/proc/self/cgroup").read_text().strip().split("::", 1)[1].lstrip("/")
    if not own:
        pytest.skip("running in the root cgroup, which the rule exempts")
    with pytest.raises(CgroupUnavailable) as refused:
        SlotCgroups(own, f"probe-{os.getpid()}").create()
    message = str(refused.value)
    assert "holds processes" in message and "no-internal-processes" in message, message
    assert "RL_SANDBOX_CGROUP_PARENT" in message, message
    assert not (CGROUP_ROOT / own / f"probe-{os.getpid()}").exists()
