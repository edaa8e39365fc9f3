"""Host-wide names kept apart between concurrent test runs on one host (e.g. two worktrees).

Cgroup parents are host-wide: two runs of the same test at once would share slot cgroups and
kill each other's jails. `RLSB_TEST_TAG=<word>` suffixes every test's cgroup parent; unset, the
names are the usual ones.
"""

from __future__ import annotations

import os

TAG = os.environ.get("RLSB_TEST_TAG", "")


def tagged(name: str) -> str:
    """`name`, suffixed with this run's tag when one is set."""
    return f"{name}-{TAG}" if TAG else name


JAIL_CGROUP_PARENT = tagged("rl-sandbox-test")
