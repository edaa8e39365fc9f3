"""The `rl-sandbox` command: one subcommand per way of running the sandbox."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="rl-sandbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one program in the jail, no service; print JSON")
    run.add_argument("file", nargs="?", default="-", help="program file, or - for stdin")
    run.add_argument("--timeout", type=float, default=10.0, help="wall-clock limit, seconds")
    run.add_argument("--memory-mb", type=int, default=1024, help="memory limit of the tree")
    run.add_argument("--stdin", default="", help="text fed to the program's standard input")
    run.add_argument("--mode", choices=["warm", "cold"], default=None, help="executor mode")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    if args.command == "run":
        from sandbox_service.run_once import run_once

        return run_once(args)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
