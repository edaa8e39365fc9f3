"""Verifier pools shared by the reward tests: starting a worker costs about 2 s (sympy's import)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import rl.reward
from rl.verifier import VerifierPool

LIMIT_S = 1.0
"""The hard time limit the tests' pools enforce."""


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
