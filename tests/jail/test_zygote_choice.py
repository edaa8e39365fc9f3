"""A warm slot's zygotes (jail/zygotes.py): the lean one for standard-library programs, the
math one for those that add only the math stack, the data one for the rest; the same answers,
seeds and limits from each."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sandbox_service.execution import ExecutionSpec, Status
from sandbox_service.jail.zygotes import ChosenZygotes
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT
from tests.jail.conftest import TEST_LIMITS

PRELOADED = "import sys\nprint(sorted({'numpy', 'sympy', 'pandas'} & set(sys.modules)))"
"""What the zygote a program forked from had preloaded (the program imports nothing itself)."""


@pytest.fixture(scope="module")
def zygotes() -> Iterator[ChosenZygotes]:
    chosen = ChosenZygotes(Settings(cgroup_parent=JAIL_CGROUP_PARENT), slot=9)
    yield chosen
    chosen.close()


def run(zygotes: ChosenZygotes, code: str, seed: int | None = None) -> str:
    result = zygotes.run(ExecutionSpec(code=code, limits=TEST_LIMITS, seed=seed))
    assert result.status == Status.OK, result
    return result.stdout


@pytest.mark.parametrize(
    ("naming", "zygote", "preloaded"),
    [
        ("", "lean", "[]\n"),
        ("import mpmath\n", "math", "['numpy', 'sympy']\n"),
        ("from scipy import special\n", "math", "['numpy', 'sympy']\n"),
        ("import pandas\n", "data", "['numpy', 'pandas', 'sympy']\n"),
    ],
)
def test_each_program_forks_from_the_zygote_its_imports_pick(
    zygotes: ChosenZygotes, naming: str, zygote: str, preloaded: str
) -> None:
    # The import sits in a function never called: what the program sees is the zygote's.
    code = "def unused():\n" + "".join(f"    {line}\n" for line in naming.splitlines()) + PRELOADED
    if not naming:
        code = PRELOADED
    runs = dict(zygotes.runs)
    assert run(zygotes, code) == preloaded
    assert zygotes.runs == {**runs, zygote: runs[zygote] + 1}


def test_an_import_the_scan_cannot_see_still_works_from_the_lean_and_the_math_zygote(
    zygotes: ChosenZygotes,
) -> None:
    code = "sp = __import__('sympy')\nx = sp.Symbol('x')\nprint(sp.solve(x**2 - 4, x))"
    assert run(zygotes, code) == "[-2, 2]\n"
    frame = "import numpy\npd = __import__('pandas')\nprint(pd.DataFrame({'a': [1, 2]}).a.sum())"
    assert run(zygotes, frame) == "3\n"
    assert zygotes.runs["math"] >= 1


def test_a_seed_draws_the_same_numbers_from_every_zygote(zygotes: ChosenZygotes) -> None:
    draw = "import random\nprint(random.random(), __import__('numpy').random.rand())"
    lean = run(zygotes, draw, seed=7)
    assert run(zygotes, "import numpy\n" + draw, seed=7) == lean
    assert run(zygotes, "import pandas\n" + draw, seed=7) == lean
    assert run(zygotes, draw, seed=8) != lean
    assert run(zygotes, draw) != run(zygotes, draw)  # unseeded: fresh entropy in every run


@pytest.mark.parametrize("naming", ["", "import numpy\n", "import pandas\n"])
def test_limits_hold_in_every_zygote(zygotes: ChosenZygotes, naming: str) -> None:
    hog = naming + "b = bytearray(2 * 1024**3)\nprint('allocated')"
    result = zygotes.run(ExecutionSpec(code=hog, limits=TEST_LIMITS))
    assert result.status == Status.MEMORY_LIMIT, result
    forker = naming + "import os\nfor _ in range(64):\n    os.fork()\nprint('forked')"
    result = zygotes.run(ExecutionSpec(code=forker, limits=TEST_LIMITS))
    assert result.status != Status.OK, result
    assert run(zygotes, naming + "print(sum(range(10)))") == "45\n"


def test_a_slot_without_the_math_zygote_runs_math_programs_on_the_data_one() -> None:
    settings = Settings(cgroup_parent=JAIL_CGROUP_PARENT, math_zygote=False)
    chosen = ChosenZygotes(settings, slot=10)
    try:
        assert sorted(chosen.executors) == ["data", "lean"]
        assert run(chosen, "def unused():\n    import numpy\n" + PRELOADED) == (
            "['numpy', 'pandas', 'sympy']\n"
        )
        assert chosen.runs["math"] == 1
    finally:
        chosen.close()
