"""A warm slot's two zygotes (jail/zygotes.py): the lean one for standard-library programs, the
math one for the rest; the same answers, seeds and limits from either."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox_service.execution import ExecutionSpec, Status
from sandbox_service.jail.zygotes import ChosenZygotes
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT
from tests.jail.conftest import TEST_LIMITS


@pytest.fixture(scope="module")
def zygotes() -> Iterator[ChosenZygotes]:
    chosen = ChosenZygotes(Settings(cgroup_parent=JAIL_CGROUP_PARENT), slot=9)
    yield chosen
    chosen.close()


def run(zygotes: ChosenZygotes, code: str, seed: int | None = None) -> str:
    result = zygotes.run(ExecutionSpec(code=code, limits=TEST_LIMITS, seed=seed))
    assert result.status == Status.OK, result
    return result.stdout


def test_a_standard_library_program_forks_from_a_zygote_without_the_math_stack(
    zygotes: ChosenZygotes,
) -> None:
    runs = dict(zygotes.runs)
    assert run(zygotes, "import sys\nprint('numpy' in sys.modules)") == "False\n"
    assert run(zygotes, "import sys, mpmath\nprint('numpy' in sys.modules)") == "True\n"
    assert zygotes.runs == {"lean": runs["lean"] + 1, "math": runs["math"] + 1}


def test_an_import_the_scan_cannot_see_still_works_from_the_lean_zygote(
    zygotes: ChosenZygotes,
) -> None:
    code = "sp = __import__('sympy')\nx = sp.Symbol('x')\nprint(sp.solve(x**2 - 4, x))"
    assert run(zygotes, code) == "[-2, 2]\n"


def test_a_seed_draws_the_same_numbers_from_either_zygote(zygotes: ChosenZygotes) -> None:
    draw = "import random\nprint(random.random(), __import__('numpy').random.rand())"
    lean = run(zygotes, draw, seed=7)
    math = run(zygotes, "import numpy\n" + draw, seed=7)
    assert lean == math
    assert run(zygotes, draw, seed=8) != lean
    assert run(zygotes, draw) != run(zygotes, draw)  # unseeded: fresh entropy in every run


def test_limits_hold_in_the_lean_zygote(zygotes: ChosenZygotes) -> None:
    hog = "b = bytearray(2 * 1024**3)\nprint('allocated')"
    result = zygotes.run(ExecutionSpec(code=hog, limits=TEST_LIMITS))
    assert result.status == Status.MEMORY_LIMIT, result
    assert run(zygotes, "print(sum(range(10)))") == "45\n"
