"""Fixtures of the trainer-integration tests: the real service, and a trainer's environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainer_env import client_only_path, trainer_python

from sandbox_service.local.private import PrivateService
from sandbox_service.local.redis_server import start_redis_server

TEST_TAG_SUFFIX = f"-{os.environ['RLSB_TEST_TAG']}" if os.environ.get("RLSB_TEST_TAG") else ""
"""tests/host_tag.py's suffix (this directory is not the `tests` package: see there)."""


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateService]:
    """`rl-sandbox up` with its own Redis, jail uids and cgroup parent, for this directory."""
    redis = start_redis_server()
    log_path = tmp_path_factory.mktemp("integration-service") / "up.log"
    running = PrivateService(
        {
            "redis_url": redis.url,
            "workers": "2",
            "cgroup_parent": "rl-sandbox-integration-tests" + TEST_TAG_SUFFIX,
            "sandbox_uid_base": "63700",
            "log_level": "WARNING",
            "shutdown_grace_s": "5",
        },
        log_path=log_path,
    )
    try:
        running.start()
        yield running
    finally:
        running.stop()
        redis.stop()


@pytest.fixture(scope="session")
def trainer_env() -> Path:
    """The trainers' environment's interpreter (verl, TRL, OpenRLHF): built once, cached."""
    return trainer_python()


@pytest.fixture(scope="session")
def client_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PYTHONPATH entry that holds this checkout's trainer_client and nothing else."""
    return client_only_path(tmp_path_factory.mktemp("client-only"))
