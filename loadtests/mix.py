"""The tool-call mix of the load test: what an RL policy sends, each with the result it must get.

A policy writing Python as tool calls mostly prints and computes (arithmetic, sympy, numpy), often
fails (exceptions, syntax errors), sometimes loops until its time limit, and now and then does
something hostile (fork bombs, memory hogs, network, ptrace, killing things). Every program
carries the statuses it may end with and, when it succeeds, its exact stdout, so the load test
checks what the service answered, not only the HTTP code. Pure: no I/O; inputs vary per call.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Program:
    """One tool call and what its result must show."""

    kind: str
    """The group it is counted in (print, sympy, error, hostile, ...)."""
    name: str
    code: str
    expect: frozenset[str]
    """Statuses it may end with."""
    stdout: str | None = None
    """Exact stdout when it ends `ok`; None: not checked."""
    stdin: str = ""
    timeout: float = 10.0
    memory_mb: int = 1024

    def request(self) -> dict[str, Any]:
        """The /execute body."""
        body: dict[str, Any] = {"code": self.code, "timeout": self.timeout}
        if self.stdin:
            body["stdin"] = self.stdin
        if self.memory_mb != 1024:
            body["memory_mb"] = self.memory_mb
        return body

    def check(self, result: Mapping[str, Any]) -> str | None:
        """None when the result is what this program must get, else what is wrong."""
        status = result.get("status")
        if status not in self.expect:
            tail = str(result.get("stderr", ""))[-160:]
            return f"{self.name}: status {status!r}, expected {sorted(self.expect)}; {tail!r}"
        if status == "ok" and self.stdout is not None and result.get("stdout") != self.stdout:
            return f"{self.name}: stdout {str(result.get('stdout'))[:80]!r} != {self.stdout!r}"
        if status == "error" and not result.get("exit_code"):
            return f"{self.name}: status error with exit code {result.get('exit_code')!r}"
        return None


OK = frozenset({"ok"})
ERROR = frozenset({"error"})
TIMEOUT = frozenset({"timeout"})
CONTAINED = frozenset({"error", "killed", "memory_limit", "timeout"})
"""What a hostile program may end with: anything but ok or an infrastructure failure."""


def _next_prime(n: int) -> int:
    n += 1
    while any(n % d == 0 for d in range(2, int(n**0.5) + 1)) or n < 2:
        n += 1
    return n


def _fib(k: int) -> int:
    a, b = 0, 1
    for _ in range(k):
        a, b = b, a + b
    return a


SYMPY = "import sympy as sp\nx = sp.symbols('x')\n"
NUMPY = "import numpy as np\n"


def _print(r: random.Random) -> Program:
    n = r.randrange(10**6)
    return Program("print", "print", f"print({n})", OK, f"{n}\n")


def _arith(r: random.Random) -> Program:
    n = r.randrange(100, 5000)
    return Program(
        "arith", "sum of squares", f"print(sum(i * i for i in range({n})))", OK,
        f"{sum(i * i for i in range(n))}\n",
    )  # fmt: skip


def _string(r: random.Random) -> Program:
    word = "".join(r.choice("abcdefgh") for _ in range(12))
    return Program(
        "arith", "string", f"s = {word!r}\nprint(s[::-1].upper(), len(set(s)))", OK,
        f"{word[::-1].upper()} {len(set(word))}\n",
    )  # fmt: skip


def _sympy(r: random.Random) -> Program:
    a = r.randrange(-9, 10)
    b = a + r.randrange(1, 9)
    k = r.randrange(1, 9)
    n = r.randrange(1000, 100000)
    return r.choice(
        [
            Program("sympy", "solve", f"{SYMPY}print(sp.solve((x - {a}) * (x - {b}), x))", OK,
                    f"[{a}, {b}]\n"),
            Program("sympy", "integrate", f"{SYMPY}print(sp.integrate(x**{k}, (x, 0, 1)))", OK,
                    f"1/{k + 1}\n"),
            Program("sympy", "nextprime", f"{SYMPY}print(sp.nextprime({n}))", OK,
                    f"{_next_prime(n)}\n"),
            Program("sympy", "simplify", f"{SYMPY}print(sp.simplify(sp.sin(x)**2 + sp.cos(x)**2))",
                    OK, "1\n"),
        ]
    )  # fmt: skip


def _numpy(r: random.Random) -> Program:
    seed = r.randrange(10**6)
    n = r.randrange(2, 10**5)
    k = r.randrange(1, 60)
    return r.choice(
        [
            Program("numpy", "linsolve",
                    f"{NUMPY}rng = np.random.default_rng({seed})\na = rng.random((48, 48))\n"
                    "print(bool(np.allclose(np.linalg.solve(a, a @ np.ones(48)), 1)))",
                    OK, "True\n"),
            Program("numpy", "mean", f"{NUMPY}print(float(np.arange({n}).mean()))", OK,
                    f"{(n - 1) / 2}\n"),
            Program("numpy", "matrix_power",
                    f"{NUMPY}m = np.array([[1, 1], [1, 0]], dtype=np.int64)\n"
                    f"print(int(np.linalg.matrix_power(m, {k})[0, 1]))", OK, f"{_fib(k)}\n"),
        ]
    )  # fmt: skip


def _stdin(r: random.Random) -> Program:
    numbers = [r.randrange(1000) for _ in range(r.randrange(1, 50))]
    return Program(
        "stdin", "sum stdin", "import sys\nprint(sum(map(int, sys.stdin.read().split())))", OK,
        f"{sum(numbers)}\n", stdin=" ".join(map(str, numbers)),
    )  # fmt: skip


def _error(r: random.Random) -> Program:
    return r.choice(
        [
            Program("error", "ZeroDivisionError", f"print({r.randrange(9)} / 0)", ERROR),
            Program("error", "NameError", "print(undefined_name)", ERROR),
            Program("error", "SyntaxError", "def f(:\n    pass", ERROR),
            Program("error", "sys.exit(3)", "import sys\nsys.exit(3)", ERROR),
            Program("error", "AssertionError", "assert 1 + 1 == 3, 'arithmetic'", ERROR),
        ]
    )


def _timeout(r: random.Random) -> Program:
    return r.choice(
        [
            Program("timeout", "busy loop", "while True:\n    pass", TIMEOUT, timeout=0.5),
            Program("timeout", "sleep", "import time\ntime.sleep(30)", TIMEOUT, timeout=0.5),
        ]
    )


HOSTILE: tuple[Program, ...] = (
    Program("hostile", "fork bomb",
            "import os\nwhile True:\n    try:\n        os.fork()\n"
            "    except OSError:\n        pass", CONTAINED, timeout=1.0),
    Program("hostile", "memory hog", "x = []\nwhile True:\n    x.append(bytearray(1 << 24))",
            frozenset({"memory_limit"}), memory_mb=128),
    Program("hostile", "network", "import socket\nsocket.create_connection(('1.1.1.1', 80), 1)",
            ERROR),
    # seccomp answers ptrace with EPERM (-1, errno 1); a 0 would mean the jail let it through.
    Program("hostile", "ptrace", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())", OK, "-1 1\n"),
    Program("hostile", "kill itself", "import os\nos.kill(os.getpid(), 9)",
            frozenset({"killed"})),
    Program("hostile", "kill pid 1", "import os\ntry:\n    os.kill(1, 9)\nexcept OSError:\n"
            "    pass\nprint('alive')", frozenset({"ok", "error", "killed"})),
    Program("hostile", "read secrets", "print(open('/etc/shadow').read())", ERROR),
    Program("hostile", "daemon", "import subprocess\nsubprocess.Popen(['sleep', '60'])\n"
            "print('started')", OK, "started\n"),
)  # fmt: skip


def _hostile(r: random.Random) -> Program:
    return r.choice(HOSTILE)


MIX: tuple[tuple[Callable[[random.Random], Program], int], ...] = (
    (_print, 30),
    (_arith, 8),
    (_string, 5),
    (_sympy, 15),
    (_numpy, 12),
    (_stdin, 5),
    (_error, 10),
    (_timeout, 2),
    (_hostile, 3),
)
"""Program makers and their weights (share of single calls, in percent)."""


def pick(r: random.Random) -> Program:
    """One program drawn from the mix."""
    makers, weights = zip(*MIX, strict=True)
    maker: Callable[[random.Random], Program] = r.choices(makers, weights)[0]
    return maker(r)


def every_kind(r: random.Random) -> list[Program]:
    """At least one program of every maker and every hostile program (for tests)."""
    return [maker(r) for maker, _ in MIX] + list(HOSTILE)
