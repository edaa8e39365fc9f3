"""cgroup v2 file handling, against a directory laid out like the unified hierarchy.

The machines here mount cgroup v1, where tests/jail exercise the real kernel; this checks the
v2 branch's file names, arithmetic and delegation steps on a stand-in tree that mimics the
kernel's files. The real v2 kernel runs tests/cgroup2 in a guest (`make test-cgroup2`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_service.jail.cgroup_delegation import DelegationError, delegate_parent
from sandbox_service.jail.cgroups import (
    MIB,
    CgroupUnavailable,
    SlotCgroups,
    cpu_max_line,
    is_v2,
)


def make_tree(root: Path, delegated: str, controllers: str = "cpu memory pids") -> Path:
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text(delegated)
    parent = root / "rl-sandbox"
    parent.mkdir()
    (parent / "cgroup.controllers").write_text(delegated)
    (parent / "cgroup.subtree_control").write_text(delegated)
    return parent


def fake_kernel_files(slot: Path, current: int, oom_kills: int) -> None:
    slot.mkdir(exist_ok=True)
    (slot / "memory.current").write_text(f"{current}\n")
    (slot / "memory.events").write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {oom_kills}\n")
    for name in ("memory.max", "pids.max", "cgroup.procs", "memory.swap.max"):
        (slot / name).write_text("")


def test_v2_is_detected(tmp_path: Path) -> None:
    assert not is_v2(tmp_path)
    make_tree(tmp_path, "memory pids")
    assert is_v2(tmp_path)


def test_v2_delegation_enables_the_controllers_at_every_level(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    # A stand-in for the kernel, which fills cgroup.controllers of a new cgroup by itself.
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "cgroup.controllers").write_text("cpu memory pids\n")
    (tmp_path / "a" / "b").mkdir()
    (tmp_path / "a" / "b" / "cgroup.controllers").write_text("cpu memory pids\n")
    assert delegate_parent("a/b", tmp_path) == {"cpu", "memory", "pids"}
    # Required and optional controllers are written separately: a refused +cpu fails nothing.
    for level in (tmp_path, tmp_path / "a", tmp_path / "a" / "b"):
        assert (level / "cgroup.subtree_control").read_text() == "+cpu"


def test_v2_delegation_skips_what_is_already_enabled(tmp_path: Path) -> None:
    parent = make_tree(tmp_path, "cpu memory pids")
    assert delegate_parent("rl-sandbox", tmp_path) == {"cpu", "memory", "pids"}
    assert (parent / "cgroup.subtree_control").read_text() == "cpu memory pids"


def test_v2_delegation_without_cpu_still_gives_memory_and_pids(tmp_path: Path) -> None:
    make_tree(tmp_path, "memory pids", controllers="memory pids")
    assert delegate_parent("rl-sandbox", tmp_path) == {"memory", "pids"}


def test_v2_refuses_a_host_without_the_memory_controller(tmp_path: Path) -> None:
    make_tree(tmp_path, "pids", controllers="cpu pids")
    with pytest.raises(CgroupUnavailable, match="lacks the memory controller"):
        SlotCgroups("rl-sandbox", "slot0-1", root=tmp_path).create()


def test_v2_refuses_a_parent_whose_parent_keeps_a_controller(tmp_path: Path) -> None:
    make_tree(tmp_path, "cpu", controllers="cpu memory pids")
    (tmp_path / "rl-sandbox" / "cgroup.controllers").write_text("cpu")  # root gave it only cpu
    with pytest.raises(DelegationError, match=r"memory pids controller.*hand that controller"):
        delegate_parent("rl-sandbox", tmp_path)


def test_v2_delegation_error_names_the_file_and_the_fix(tmp_path: Path) -> None:
    parent = make_tree(tmp_path, "", controllers="cpu memory pids")
    (parent / "cgroup.controllers").write_text("cpu memory pids")
    (parent / "cgroup.subtree_control").unlink()
    (parent / "cgroup.subtree_control").symlink_to(tmp_path / "gone" / "file")  # writes fail
    with pytest.raises(DelegationError, match=r"cannot enable \+memory \+pids in .*rl-sandbox"):
        delegate_parent("rl-sandbox", tmp_path)


@pytest.mark.parametrize("parent", ["", "/", "../escape", "a/../../b"])
def test_v2_parent_must_lie_below_the_root(tmp_path: Path, parent: str) -> None:
    make_tree(tmp_path, "memory pids")
    with pytest.raises(DelegationError, match="relative path"):
        delegate_parent(parent, tmp_path)


@pytest.mark.parametrize(
    ("cores", "line"),
    [
        (1.0, "100000 100000"),
        (0.5, "50000 100000"),
        (2.5, "250000 100000"),
        (0.001, "1000 100000"),
        (None, "max 100000"),
    ],
)
def test_cpu_max_line(cores: float | None, line: str) -> None:
    assert cpu_max_line(cores) == line


@pytest.mark.parametrize("cores", [0.0, -1.0, float("nan"), float("inf")])
def test_cpu_limit_must_be_positive(cores: float) -> None:
    with pytest.raises(ValueError, match="positive and finite"):
        cpu_max_line(cores)


def test_v2_cpu_limit_and_throttling_counters(tmp_path: Path) -> None:
    parent = make_tree(tmp_path, "cpu memory pids")
    slot = parent / "slot0-1"
    fake_kernel_files(slot, current=0, oom_kills=0)
    (slot / "cpu.max").write_text("max 100000\n")
    (slot / "cpu.stat").write_text(
        "usage_usec 900\nuser_usec 800\nsystem_usec 100\n"
        "nr_periods 12\nnr_throttled 7\nthrottled_usec 3500\n"
    )
    cgroups = SlotCgroups("rl-sandbox", "slot0-1", root=tmp_path)
    cgroups.create()
    cgroups.set_cpu_limit(1.5)
    assert (slot / "cpu.max").read_text() == "150000 100000"
    throttling = cgroups.cpu_throttling()
    assert (throttling.periods, throttling.throttled_periods, throttling.throttled_us) == (
        12,
        7,
        3500,
    )
    cgroups.set_cpu_limit(None)
    assert (slot / "cpu.max").read_text() == "max 100000"


def test_v2_cpu_limit_without_the_cpu_controller_says_so(tmp_path: Path) -> None:
    parent = make_tree(tmp_path, "memory pids", controllers="memory pids")
    fake_kernel_files(parent / "slot0-1", current=0, oom_kills=0)
    cgroups = SlotCgroups("rl-sandbox", "slot0-1", root=tmp_path)
    cgroups.create()
    with pytest.raises(CgroupUnavailable, match=r"does not delegate \+cpu"):
        cgroups.set_cpu_limit(1.0)


def test_v2_limits_and_oom_detection(tmp_path: Path) -> None:
    parent = make_tree(tmp_path, "cpu memory pids")
    slot = parent / "slot0-1"
    run = slot / "run"
    fake_kernel_files(slot, current=0, oom_kills=0)
    fake_kernel_files(run, current=10 * MIB, oom_kills=0)
    cgroups = SlotCgroups("rl-sandbox", "slot0-1", root=tmp_path)
    cgroups.create()
    # The slot holds no process: its controllers are for its two children (v2's rule).
    assert (slot / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (run / "memory.swap.max").read_text() == "0"
    cgroups.add_process(4242)
    assert (slot / "zygote" / "cgroup.procs").read_text() == "4242"
    assert (run / "cgroup.procs").read_text() == ""  # the zygote is outside the run's limits
    assert cgroups.run_dirs == [run]
    cgroups.prepare_execution(memory_mb=256, max_processes=32)
    assert int((run / "memory.max").read_text()) == 10 * MIB + 256 * MIB
    assert (run / "pids.max").read_text() == "32"
    assert cgroups.usage().oom_killed is False
    fake_kernel_files(run, current=12 * MIB, oom_kills=1)
    usage = cgroups.usage()
    assert usage.oom_killed is True
    assert usage.peak_memory_mb is None  # no memory.peak in this tree: not reported


def test_v2_session_limit_covers_the_whole_life(tmp_path: Path) -> None:
    parent = make_tree(tmp_path, "memory pids")
    run = parent / "sess-1" / "run"
    fake_kernel_files(parent / "sess-1", current=0, oom_kills=0)
    fake_kernel_files(run, current=50 * MIB, oom_kills=0)
    cgroups = SlotCgroups("rl-sandbox", "sess-1", whole_life=True, root=tmp_path)
    cgroups.create()
    cgroups.add_process(1)
    fake_kernel_files(run, current=300 * MIB, oom_kills=0)  # the session grew
    cgroups.prepare_execution(memory_mb=512, max_processes=8)
    assert int((run / "memory.max").read_text()) == 50 * MIB + 512 * MIB
