"""A program run in a fresh interpreter of this venv, for tests that change a process for good."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run_python(source: str, timeout_s: float = 120) -> str:
    """The program's stdout, stripped; the test fails with its stderr if it exits non-zero."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
