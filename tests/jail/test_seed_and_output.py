"""Seeds and cut output in a real jail, warm and cold: the same program and seed print the
same thing; a flood of output keeps its head and tail and its true size."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from sandbox_service.execution import Status
from tests.jail.conftest import TEST_LIMITS, RunFn

DRAWS = (
    "import random, mpmath, numpy, sympy\n"
    "print(random.random(), random.getrandbits(64), mpmath.rand())\n"
    "print(numpy.random.random(3), numpy.random.standard_normal(), numpy.random.randint(10**9))\n"
    "print(sympy.randprime(10**20, 10**21), sympy.core.random.rng.random())\n"
)


def test_the_same_seed_draws_the_same_numbers(run: RunFn) -> None:
    first = run(DRAWS, seed=1234, timeout_s=20.0)
    assert first.status == Status.OK, first.stderr
    again = run(DRAWS, seed=1234, timeout_s=20.0)
    other = run(DRAWS, seed=1235, timeout_s=20.0)
    unseeded = [run(DRAWS, timeout_s=20.0).stdout for _ in range(2)]
    assert again.stdout == first.stdout
    first_lines, other_lines = first.stdout.splitlines(), other.stdout.splitlines()
    # Every generator moved with the seed, each line of draws differs.
    assert all(a != b for a, b in zip(first_lines, other_lines, strict=True))
    assert unseeded[0] != unseeded[1] and first.stdout not in unseeded


def test_a_seed_seeds_generators_imported_inside_the_run(run: RunFn) -> None:
    code = "import sys\nloaded = 'numpy' in sys.modules\nimport numpy\nprint(numpy.random.rand())"
    assert run(code, seed=7).stdout == run(code, seed=7).stdout


FLOOD = (
    "import sys\n"
    "sys.stdout.write('HEAD' + 'a' * 100000)\n"
    "for i in range(200):\n"
    "    sys.stdout.write('b' * 10000)\n"
    "sys.stdout.write('c' * 100000 + 'TAIL')\n"
    "sys.stderr.write('E' * 50)\n"
)
FLOOD_BYTES = 4 + 100000 + 200 * 10000 + 100000 + 4


def test_a_flood_keeps_head_and_tail_and_counts_every_byte(run: RunFn) -> None:
    result = run(FLOOD)
    assert result.status == Status.OK, result.stderr  # not killed for printing a lot
    assert result.stdout_truncated and result.stdout_bytes == FLOOD_BYTES
    cap = TEST_LIMITS.max_output_bytes
    assert len(result.stdout.encode()) <= cap
    marker = re.search(r"\n\[\.\.\. (\d+) bytes omitted \.\.\.\]\n", result.stdout)
    assert marker is not None
    head, tail = result.stdout[: marker.start()], result.stdout[marker.end() :]
    assert head.startswith("HEADaaa") and tail.endswith("cccTAIL")
    assert int(marker.group(1)) == FLOOD_BYTES - len(head) - len(tail)
    assert not result.stderr_truncated and result.stderr_bytes == 50 and result.stderr == "E" * 50


def test_string_hashes_are_the_same_in_every_jail(run: RunFn) -> None:
    # `run` is warm and cold in turn; the reference is a plain interpreter with hash seed 0.
    code = "print(list({'apple', 'banana', 'cherry', 'date', 'elder', 'fig'}), hash('x'))"
    env = {"PYTHONHASHSEED": "0", "PATH": os.environ.get("PATH", "")}
    reference = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert run(code).stdout == reference.stdout
