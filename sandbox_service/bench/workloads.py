"""The benchmark's workloads: programs with a known answer per call, and a check of each result.

Every call carries its own index in the program and expects it back in the output, so a result
delivered to the wrong request is a failure, not a success. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

FLOOD_BYTES = 1 << 20
"""What the flood workload writes to each of stdout and stderr (well past any output cap)."""


@dataclass(frozen=True, slots=True)
class Workload:
    """A family of programs: the code of call i and what its result must show."""

    name: str
    description: str
    code: Callable[[int], str]
    expected_stdout: Callable[[int], str]
    flood: bool = False
    """Output is capped by the server: check a prefix and the truncation flag, not the text."""
    stdlib_only: bool = False
    """Imports nothing outside the standard library (so `python -I -S` can run it)."""

    def check(self, i: int, result: Mapping[str, Any]) -> str | None:
        """None when the result of call i is right, else what is wrong."""
        status, stdout = result.get("status"), result.get("stdout", "")
        if status != "ok":
            return f"status {status!r} (exit {result.get('exit_code')}): {_short(result)}"
        expected = self.expected_stdout(i)
        if self.flood:
            full = len(stdout) == len(expected)
            cut = bool(result["stdout_truncated"])
            if not (
                stdout
                and (expected.startswith(stdout) or (cut and _head_and_tail_of(stdout, expected)))
                and (full or cut)
            ):
                truncated = result.get("stdout_truncated")
                return f"flood output wrong: {len(stdout)} chars, truncated {truncated}"
            return None
        if stdout != expected:
            return f"stdout {stdout[:80]!r}, expected {expected[:80]!r}"
        return None


def _head_and_tail_of(stdout: str, expected: str) -> bool:
    """Whether a cut stdout is a head of `expected`, the service's omission marker naming the
    bytes left out (ASCII here: one byte a character), and a tail of it."""
    head, marker, rest = stdout.partition("\n[... ")
    omitted, end, tail = rest.partition(" bytes omitted ...]\n")
    return (
        bool(marker and end and omitted.isdigit())
        and expected.startswith(head)
        and expected.endswith(tail)
        and len(head) + int(omitted) + len(tail) == len(expected)
    )


def _short(result: Mapping[str, Any]) -> str:
    return str(result.get("stderr", ""))[-200:]


def _roots(i: int) -> tuple[int, int]:
    a = i % 10
    return a, a + 1 + i % 7


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "print",
            "print(i): a trivial tool call, all overhead",
            code=lambda i: f"print({i})",
            expected_stdout=lambda i: f"{i}\n",
            stdlib_only=True,
        ),
        Workload(
            "sympy",
            "sympy solve of a quadratic (imports sympy: 0.3 s of CPU in a fresh interpreter)",
            code=lambda i: (
                "import sympy as sp\nx = sp.symbols('x')\n"
                "print(sp.solve((x - {}) * (x - {}), x))".format(*_roots(i))
            ),
            expected_stdout=lambda i: "[{}, {}]\n".format(*_roots(i)),
        ),
        Workload(
            "numpy",
            "numpy: solve a random 64x64 linear system",
            code=lambda i: (
                f"import numpy as np\nrng = np.random.default_rng({i})\n"
                "a = rng.random((64, 64))\n"
                "print(int(np.allclose(np.linalg.solve(a, a @ np.ones(64)), 1)), "
                f"{i})"
            ),
            expected_stdout=lambda i: f"1 {i}\n",
        ),
        Workload(
            "flood",
            f"writes {FLOOD_BYTES >> 20} MiB to stdout and to stderr (past the server's cap)",
            code=lambda i: (
                f"import sys\nsys.stdout.write('{i % 10}' * {FLOOD_BYTES})\n"
                f"sys.stderr.write('e' * {FLOOD_BYTES})"
            ),
            expected_stdout=lambda i: str(i % 10) * FLOOD_BYTES,
            flood=True,
            stdlib_only=True,
        ),
    )
}
"""Every workload by name."""
