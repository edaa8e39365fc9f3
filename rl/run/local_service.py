"""A private `rl-sandbox up` for one training run: started before, stopped after.

It gets its own Redis, port, cgroup parent, queue and jail uids, so it can run beside other
services on the host, and it dies with the trainer, even when the trainer is killed
(sandbox_service.local.private).
"""

from __future__ import annotations

import os
from pathlib import Path

from sandbox_service.local.private import PrivateService


class LocalService(PrivateService):
    """The trainer's own service, as a context manager (`.url` once entered)."""

    def __init__(self, log_path: Path, *, workers: int = 2, uid_base: int = 64000) -> None:
        tag = f"rl-train-{os.getpid()}"
        settings = {
            "workers": str(workers),
            "cgroup_parent": tag,
            "queue_name": tag,
            "sandbox_uid_base": str(uid_base),
            "log_level": "WARNING",
            "shutdown_grace_s": "5",
        }
        super().__init__(settings, log_path=log_path, inherit_settings=True)
