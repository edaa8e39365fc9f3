"""The focused set that must hold on either cgroup hierarchy: here on the host's (v1 on the
development machines), and on cgroup v2 inside a Debian guest (`make test-cgroup2`)."""

from __future__ import annotations

import os

import pytest

from sandbox_service.jail import cgroups


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="cgroups and nsjail need root")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def hierarchy() -> str:
    """ "v2" or "v1": which one this run proves."""
    return "v2" if cgroups.is_v2() else "v1"
