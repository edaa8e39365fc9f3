#!/usr/bin/env python3
"""`make deploy-check`: validate deploy/ offline; print each problem, exit 1 if there is any.

The checks are in deploy/deploycheck/ (see its docstring); tests/deploy runs the same ones.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
ROOT = DEPLOY.parent
sys.path.insert(0, str(DEPLOY))

from deploycheck import compose, dockerfile, k8s, monitoring, seccomp  # noqa: E402


def checks() -> dict[str, Callable[[], list[str]]]:
    """Every check by name: the Dockerfile, the compose file, the seccomp profile, the dashboard
    and alert rules, each kustomization."""
    out: dict[str, Callable[[], list[str]]] = {
        "dockerfile": lambda: dockerfile.check(DEPLOY / "Dockerfile", ROOT),
        "compose": lambda: compose.check(DEPLOY / "compose.yaml", ROOT),
        "seccomp": lambda: seccomp.check(ROOT / seccomp.PROFILE),
        "monitoring": lambda: monitoring.check(ROOT),
    }
    for directory in k8s.kustomizations(DEPLOY / "k8s"):
        name = directory.relative_to(DEPLOY).as_posix()
        out[name] = lambda d=directory: k8s.check(d, ROOT)
    return out


def main() -> int:
    """Run every check; the exit status says whether all passed."""
    failed, everything = 0, checks()
    for name, run in everything.items():
        start = time.perf_counter()
        problems = run()
        took = time.perf_counter() - start
        print(f"{'FAIL' if problems else 'ok  '} {name} ({took:.1f} s)")
        for problem in problems:
            print(f"     - {problem}")
        failed += bool(problems)
    print(f"deploy-check: {len(everything) - failed} of {len(everything)} checks clean")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
