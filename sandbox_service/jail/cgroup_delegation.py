"""cgroup v2: create the service's parent cgroup and delegate controllers to its slot cgroups.

In the unified hierarchy a slot cgroup has the memory, pids and cpu files only if every ancestor
enables those controllers for its children (`cgroup.subtree_control`). A stock host enables
nothing for a new top-level cgroup, so the worker (root) does it itself, from the mount's root
down to `<parent>`. Two rules of the kernel decide whether it can:

- no internal processes: a non-root cgroup that holds processes cannot enable controllers for
  its children (EBUSY). The mount's root is exempt; a container's cgroup namespace root is not,
  which is why deploy/worker-entrypoint.sh first moves the container's processes to a leaf;
- a controller can be enabled only where the parent has enabled it (else EINVAL or ENOENT).

When a step fails, the error names the cgroup, the rule and the fix.
"""

from __future__ import annotations

import errno
from pathlib import Path

REQUIRED_CONTROLLERS = ("memory", "pids")
OPTIONAL_CONTROLLERS = ("cpu",)
"""Enabled where the host has it; only a CPU limit needs it (cgroups.SlotCgroups.set_cpu_limit)."""


class DelegationError(RuntimeError):
    """The parent cgroup cannot be created or given its controllers; the message says why."""


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except FileNotFoundError:
        return set()


def _levels(root: Path, parent: str) -> list[Path]:
    """Every cgroup from the mount's root down to the parent, the root first."""
    parts = [p for p in Path(parent).parts if p not in ("", "/")]
    if not parts or any(p in (".", "..") for p in parts):
        raise DelegationError(f"cgroup parent {parent!r} must be a relative path below {root}")
    levels = [root]
    for part in parts:
        levels.append(levels[-1] / part)
    return levels


def _fix_for(level: Path, root: Path, error: OSError) -> str:
    if error.errno == errno.EBUSY:
        return (
            f"{level} holds processes, and cgroup v2 lets a cgroup that holds processes delegate "
            "no controller (the no-internal-processes rule): move them to a leaf cgroup first "
            "(deploy/worker-entrypoint.sh does it in containers), or set RL_SANDBOX_CGROUP_PARENT "
            f"to a cgroup beside them, e.g. a new top-level one under {root}"
        )
    if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"the worker may not write {level}: run it as root on a read-write cgroup2 mount "
            "(in a container: CAP_SYS_ADMIN, and deploy/worker-entrypoint.sh remounts it)"
        )
    return (
        f"{level}'s parent does not hand that controller down: enable it there first "
        f"(echo +memory +pids +cpu > {level.parent}/cgroup.subtree_control), or ask the host's "
        "init system to delegate it (systemd: Delegate=yes on the unit that runs the workers)"
    )


def _enable(
    level: Path, root: Path, batch: list[str], wanted: list[str], required: bool
) -> list[str]:
    """Enable `batch` for level's children; an optional controller that the kernel refuses
    (cpu, next to a realtime process) is left out rather than failing the worker."""
    try:
        (level / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in batch))
    except OSError as exc:
        if not required:
            return [c for c in wanted if c not in batch]
        raise DelegationError(
            f"cannot enable {' '.join('+' + c for c in batch)} in "
            f"{level / 'cgroup.subtree_control'}: {exc.strerror}; {_fix_for(level, root, exc)}"
        ) from exc
    return wanted


def delegate_parent(parent: str, root: Path) -> frozenset[str]:
    """Create `root/parent` and enable its controllers for its children (idempotent).

    Returns the controllers the slot cgroups get: memory and pids always (DelegationError when
    either cannot be had), cpu where the host has it.
    """
    levels = _levels(root, parent)
    available = _words(root / "cgroup.controllers")
    missing = [c for c in REQUIRED_CONTROLLERS if c not in available]
    if missing:
        raise DelegationError(
            f"cgroup v2 at {root} lacks the {' and '.join(missing)} controller "
            f"(cgroup.controllers: {' '.join(sorted(available)) or 'none'}): the kernel or the "
            "container runtime does not offer it"
        )
    wanted = [c for c in (*REQUIRED_CONTROLLERS, *OPTIONAL_CONTROLLERS) if c in available]
    for level in levels:
        try:
            level.mkdir(exist_ok=True)
        except OSError as exc:
            raise DelegationError(
                f"cannot create {level}: {exc.strerror}; {_fix_for(level, root, exc)}"
            ) from exc
        present = _words(level / "cgroup.controllers") if level != root else available
        enabled = _words(level / "cgroup.subtree_control")
        todo = [c for c in wanted if c not in enabled]
        if not todo:
            continue
        lacking = [c for c in todo if c not in present]
        if any(c in REQUIRED_CONTROLLERS for c in lacking):
            raise DelegationError(
                f"{level} does not have the {' '.join(lacking)} controller(s): "
                f"{_fix_for(level, root, OSError(errno.EINVAL, 'not available'))}"
            )
        wanted = [c for c in wanted if c in present]
        for group in (REQUIRED_CONTROLLERS, OPTIONAL_CONTROLLERS):
            batch = [c for c in todo if c in group and c in present]
            if batch:
                wanted = _enable(level, root, batch, wanted, required=group is REQUIRED_CONTROLLERS)
    return frozenset(wanted)
