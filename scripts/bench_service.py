#!/usr/bin/env python3
"""Superseded by `rl-sandbox bench` (sandbox_service/bench.py), which absorbed this script.

Kept so that the old command still works: `python scripts/bench_service.py [ARGS]` runs
`rl-sandbox bench [ARGS]` (see `rl-sandbox bench --help`).
"""

from __future__ import annotations

import sys

from sandbox_service.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
