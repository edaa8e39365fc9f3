"""The static import scan that picks a program's zygote (import_scan.py)."""

from __future__ import annotations

from typing import get_args

import pytest

from sandbox_service import import_scan
from sandbox_service.import_scan import MAX_SCANNED_CHARS, imported_modules, zygote_for
from sandbox_service.jail.inside import heap


@pytest.mark.parametrize(
    "code",
    [
        "print(1)",
        "import math, json\nprint(math.pi)",
        "from collections import Counter\nimport os.path",
        "from __future__ import annotations\nx = 1",
        "from . import sibling",
        "__import__('numpy')",  # unseen: right answer, slower start
        "",
        "print(1",  # names no import: fails alike from either zygote
        "x = 1\n" * (MAX_SCANNED_CHARS // 6 + 1),  # too long to scan, but names no import
    ],
)
def test_standard_library_programs_fork_from_the_lean_zygote(code: str) -> None:
    assert zygote_for(code) == "lean"


@pytest.mark.parametrize(
    "code",
    [
        "import numpy as np",
        "import math, sympy",
        "from sympy import symbols",
        "from numpy.linalg import solve",
        "def f():\n    import mpmath\n    return mpmath.pi",
        "try:\n    import scipy\nexcept ImportError:\n    pass",
        "from scipy.optimize import brentq\nimport itertools, fractions",
    ],
)
def test_programs_of_the_math_stack_fork_from_the_math_zygote(code: str) -> None:
    assert zygote_for(code) == "math"


@pytest.mark.parametrize(
    "code",
    [
        "import pandas as pd",
        "import numpy, sympy\nimport pandas",
        "def f():\n    from pandas import DataFrame",
        "import matplotlib.pyplot as plt",
        "import not_a_module_anywhere",
        "import sympy\nimport not_a_module_anywhere",
        "import math\nprint(1",  # does not parse: the data zygote, whatever it meant to import
        "import math\n%timeit 1",
        "import math\nx = 1\x00",
    ],
)
def test_any_other_import_or_unparsable_source_forks_from_the_data_zygote(code: str) -> None:
    assert zygote_for(code) == "data"


def test_a_program_too_long_to_scan_takes_the_data_zygote() -> None:
    assert zygote_for("import math\n" + "x = 1\n" * (MAX_SCANNED_CHARS // 6 + 1)) == "data"


def test_the_scan_names_top_level_modules_only() -> None:
    code = "import a.b.c\nfrom d.e import f\nfrom .g import h\nimport i as j"
    assert imported_modules(code) == {"a", "d", "i"}
    assert imported_modules("def (") is None


def test_the_scan_and_the_jails_preloads_name_the_same_zygotes() -> None:
    # inside/ is loaded in the jail on its own, so it spells the names again.
    assert get_args(import_scan.Zygote) == get_args(heap.Zygote)
    assert set(heap.ZYGOTES) == set(get_args(heap.Zygote))


def test_the_math_zygote_preloads_what_the_scan_sends_it_and_nothing_of_the_data_ones() -> None:
    math = {name.split(".")[0] for name in heap.MATH_PRELOAD + heap.FULL_PRELOAD}
    assert math <= import_scan.MATH_MODULES
    data = {name.split(".")[0] for name in heap.DATA_PRELOAD}
    assert not data & import_scan.MATH_MODULES
    assert import_scan.zygote_for("import " + ", ".join(sorted(math))) == "math"
    assert import_scan.zygote_for("import " + ", ".join(sorted(data))) == "data"
