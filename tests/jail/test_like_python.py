"""A program ends in the jail as under plain `python`: each case runs the same program in a
real jail (warm and cold) and in a plain `python3 -c` subprocess, and compares what they show.

Differences kept on purpose are in docs/jail.md ("Differences from plain python").
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.jail.conftest import RunFn


@dataclass(frozen=True)
class Ending:
    exit_code: int | None
    stdout: str
    stderr_has: tuple[str, ...] = ()


CASES = {
    "excepthook": (
        "import sys\n"
        "def hook(kind, value, tb):\n"
        "    print('hooked', kind.__name__, value, tb is not None)\n"
        "sys.excepthook = hook\n"
        "raise ValueError('boom')\n"
    ),
    "excepthook_that_raises": (
        "import sys\n"
        "def hook(kind, value, tb):\n"
        "    raise RuntimeError('hook broke')\n"
        "sys.excepthook = hook\n"
        "raise ValueError('boom')\n"
    ),
    "finalizers": (
        "class Noisy:\n"
        "    def __init__(self, name): self.name = name\n"
        "    def __del__(self): print('finalized', self.name)\n"
        "a = Noisy('a')\n"
        "_b = Noisy('_b')\n"
        "print('end')\n"
    ),
    "atexit": (
        "import atexit\n"
        "atexit.register(print, 'registered first, runs last')\n"
        "atexit.register(print, 'registered last, runs first')\n"
        "print('main')\n"
    ),
    "closed_stdout": "import sys\nprint('before close')\nsys.stdout.close()\n",
    "closed_stdout_and_exit_3": "import sys\nsys.stdout.close()\nsys.exit(3)\n",
    "unflushable_stdout": (
        "import os, sys\nread_end, write_end = os.pipe()\nos.close(read_end)\n"
        "sys.stdout = open(write_end, 'w', buffering=65536)\nsys.stdout.write('pending')\n"
    ),
    "uncaught_after_atexit_order": (
        "import atexit\natexit.register(print, 'at exit')\nprint('main')\nraise KeyError('k')\n"
    ),
}

EXPECTED_STDERR = {
    "excepthook_that_raises": ("Error in sys.excepthook", "hook broke", "Original exception was"),
    "unflushable_stdout": ("Exception ignored in",),
    "uncaught_after_atexit_order": ("KeyError: 'k'",),
}


def plain_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_program_ends_as_under_plain_python(run: RunFn, case: str) -> None:
    code = CASES[case]
    plain = plain_python(code)
    jailed = run(code, timeout_s=30)
    expected = Ending(plain.returncode, plain.stdout, EXPECTED_STDERR.get(case, ()))
    for text in expected.stderr_has:
        assert text in plain.stderr, (case, plain.stderr)  # the case says what python says
        assert text in jailed.stderr, (case, jailed.stderr)
    assert (jailed.exit_code, jailed.stdout) == (expected.exit_code, expected.stdout), (
        case,
        jailed.stderr,
    )
    if not expected.stderr_has and plain.stderr == "":
        assert jailed.stderr == "", (case, jailed.stderr)


def test_a_custom_excepthook_replaces_the_traceback_but_the_error_is_still_structured(
    run: RunFn,
) -> None:
    code = CASES["excepthook"]
    result = run(code, timeout_s=30)
    assert "Traceback" not in result.stderr
    assert result.error is not None and result.error.ename == "ValueError"
