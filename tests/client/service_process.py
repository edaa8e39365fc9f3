"""A real rl-sandbox as a child process tree: `rl-sandbox up` on a free port, Redis given.

Redis is started by the fixtures (conftest.py) rather than by `up`, so that a test can kill the
service (API and workers) and start it again on the same port while the queue survives, as in a
real deployment.
"""

from __future__ import annotations

import os
from pathlib import Path

from sandbox_service.local.private import PrivateService

TEST_TAG_SUFFIX = f"-{os.environ['RLSB_TEST_TAG']}" if os.environ.get("RLSB_TEST_TAG") else ""
"""tests/host_tag.py's suffix (this directory is not the `tests` package: see there)."""


class Service(PrivateService):
    """One `rl-sandbox up` process tree, which the test can stop and start again."""

    def __init__(self, redis_url: str, log_path: Path, uid_base: int, **settings: str) -> None:
        # Nothing inherited may configure it: only what is set here. A cgroup parent and jail
        # uids of its own: other services (tests/service uses uids 62500 and up, engineers' own
        # services 62000 and up) may run on this host meanwhile.
        super().__init__(
            {
                "redis_url": redis_url,
                "workers": "2",
                "cgroup_parent": "rl-sandbox-client-tests" + TEST_TAG_SUFFIX,
                "sandbox_uid_base": str(uid_base),
                "log_level": "WARNING",
                "shutdown_grace_s": "5",
                **settings,
            },
            log_path=log_path,
        )
