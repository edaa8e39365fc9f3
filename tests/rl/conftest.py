"""Shared fixtures: verifier pools (the fork server imports sympy once) and a real sandbox."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rl_limits import LIMIT_S

import rl.reward.outcome
from rl.reward.verifier import VerifierPool
from rl.run.local_service import LocalService


@pytest.fixture(scope="session")
def verifier() -> Iterator[VerifierPool]:
    """Two workers, the soft timer on (the default), installed as answer_reward's default pool."""
    with VerifierPool(workers=2, timeout_s=LIMIT_S) as pool:
        saved = rl.reward.outcome._default_pool
        rl.reward.outcome._default_pool = pool
        try:
            yield pool
        finally:
            rl.reward.outcome._default_pool = saved


@pytest.fixture(scope="session")
def hard_verifier() -> Iterator[VerifierPool]:
    """Two workers without the soft timer: only the SIGKILL at the limit stops a check."""
    with VerifierPool(workers=2, timeout_s=LIMIT_S, soft_timeout=False) as pool:
        yield pool


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalService]:
    """A real rl-sandbox (`rl-sandbox up`: its own Redis, 2 workers, nsjail, the API)."""
    log = tmp_path_factory.mktemp("sandbox") / "up.log"
    with LocalService(log, workers=2, uid_base=64100) as running:
        yield running
