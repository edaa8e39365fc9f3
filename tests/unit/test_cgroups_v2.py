"""cgroup v2 file handling, against a directory laid out like the unified hierarchy.

The machines here mount cgroup v1, where tests/jail exercise the real kernel; this checks the
v2 branch's file names and arithmetic on a stand-in tree that mimics the kernel's files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_service.jail.cgroups import MIB, CgroupUnavailable, SlotCgroups, is_v2


def make_tree(root: Path, delegated: str) -> Path:
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    parent = root / "rl-sandbox"
    parent.mkdir()
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


def test_v2_refuses_a_parent_without_delegated_controllers(tmp_path: Path) -> None:
    make_tree(tmp_path, "cpu")
    with pytest.raises(CgroupUnavailable, match=r"\+memory \+pids"):
        SlotCgroups("rl-sandbox", "slot0-1", root=tmp_path).create()


def test_v2_limits_and_oom_detection(tmp_path: Path) -> None:
    parent = make_tree(tmp_path, "cpu memory pids")
    slot = parent / "slot0-1"
    fake_kernel_files(slot, current=10 * MIB, oom_kills=0)
    cgroups = SlotCgroups("rl-sandbox", "slot0-1", root=tmp_path)
    cgroups.create()
    assert (slot / "memory.swap.max").read_text() == "0"
    cgroups.add_process(4242)
    assert (slot / "cgroup.procs").read_text() == "4242"
    cgroups.prepare_execution(memory_mb=256, max_processes=32)
    assert int((slot / "memory.max").read_text()) == 10 * MIB + 256 * MIB
    assert (slot / "pids.max").read_text() == "33"
    assert cgroups.usage().oom_killed is False
    fake_kernel_files(slot, current=12 * MIB, oom_kills=1)
    usage = cgroups.usage()
    assert usage.oom_killed is True
    assert usage.peak_memory_mb is None  # no memory.peak in this tree: not reported


def test_v2_session_limit_covers_the_whole_life(tmp_path: Path) -> None:
    parent = make_tree(tmp_path, "memory pids")
    slot = parent / "sess-1"
    fake_kernel_files(slot, current=50 * MIB, oom_kills=0)
    cgroups = SlotCgroups("rl-sandbox", "sess-1", whole_life=True, root=tmp_path)
    cgroups.create()
    cgroups.add_process(1)
    fake_kernel_files(slot, current=300 * MIB, oom_kills=0)  # the session grew
    cgroups.prepare_execution(memory_mb=512, max_processes=8)
    assert int((slot / "memory.max").read_text()) == 50 * MIB + 512 * MIB
