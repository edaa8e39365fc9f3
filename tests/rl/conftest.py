"""Verifier pools shared by the reward and verifier tests (the fork server imports sympy once)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rl_limits import LIMIT_S

import rl.reward
from rl.verifier import VerifierPool


@pytest.fixture(scope="session")
def verifier() -> Iterator[VerifierPool]:
    """Two workers, the soft timer on (the default), installed as answer_reward's default pool."""
    with VerifierPool(workers=2, timeout_s=LIMIT_S) as pool:
        saved = rl.reward._default_pool
        rl.reward._default_pool = pool
        try:
            yield pool
        finally:
            rl.reward._default_pool = saved


@pytest.fixture(scope="session")
def hard_verifier() -> Iterator[VerifierPool]:
    """Two workers without the soft timer: only the SIGKILL at the limit stops a check."""
    with VerifierPool(workers=2, timeout_s=LIMIT_S, soft_timeout=False) as pool:
        yield pool
