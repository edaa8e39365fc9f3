"""The `rl-sandbox` command: one subcommand per way of running the sandbox."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sandbox_service import __version__

if TYPE_CHECKING:
    from sandbox_service.settings import Settings

# Nothing heavy at module level: `rl-sandbox mcp` must answer its host within a second, and
# `--help` and `--version` should not wait for pydantic-settings either.


class _Parser(argparse.ArgumentParser):
    """A parser whose help may end with every server setting (imported only for the help)."""

    def __init__(self, *args: Any, settings_help: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._settings_help = settings_help

    def format_help(self) -> str:
        text = super().format_help()
        if self._settings_help:
            from sandbox_service.settings import settings_help

            text += "\n" + settings_help()
        return text


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(prog="rl-sandbox", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rl-sandbox {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run one program in the jail, no service; print JSON")
    run.add_argument("file", nargs="?", default="-", help="program file, or - for stdin")
    run.add_argument("--timeout", type=float, default=10.0, help="wall-clock limit, seconds")
    run.add_argument("--memory-mb", type=int, default=1024, help="memory limit of the tree")
    run.add_argument("--stdin", default="", help="text fed to the program's standard input")
    run.add_argument(
        "--language",
        choices=["python", "cpp", "java", "javascript", "bash"],
        default="python",
        help="the program's language (default python)",
    )
    run.add_argument(
        "--mode",
        choices=["warm", "cold"],
        default=None,
        help="executor mode (default cold: one program pays for no preload)",
    )

    up = sub.add_parser(
        "up",
        help="run everything locally: private Redis (unless REDIS_URL), workers, API",
        description="Run everything on this host: a private Redis (unless REDIS_URL names one), "
        "one worker per core and the API. Every setting below is an environment variable.",
        settings_help=True,
    )
    _add_listen_arguments(up)
    up.add_argument("--workers", type=int, default=None, help="worker processes (default: cores)")

    api = sub.add_parser("api", help="run the HTTP API against REDIS_URL", settings_help=True)
    _add_listen_arguments(api)

    worker = sub.add_parser(
        "worker", help="run this host's worker processes against REDIS_URL", settings_help=True
    )
    worker.add_argument(
        "--workers", type=int, default=None, help="worker processes (default: cores)"
    )

    sub.add_parser(
        "worker-health",
        help="exit 0 when a worker process of this host beat recently (a container health check)",
    )

    bench = sub.add_parser(
        "bench", help="concurrency sweep on loopback, next to fresh interpreters; table and plot"
    )
    bench.add_argument("--url", default=None, help="a service on loopback (default: start one)")
    bench.add_argument(
        "--workloads", default="print,sympy", help="comma list of print, sympy, numpy, flood"
    )
    bench.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024])
    bench.add_argument("--point-s", type=float, default=8.0, help="seconds of calls per point")
    bench.add_argument("--max-calls", type=int, default=20000, help="most calls per point")
    bench.add_argument(
        "--batch", type=int, default=1, help="calls per request (>1: /execute/batch)"
    )
    bench.add_argument(
        "--compare-batch",
        type=int,
        default=0,
        help="also measure each point with this many calls per request; compare CPU per call",
    )
    bench.add_argument(
        "--batch-rounds",
        type=int,
        default=0,
        help="with --compare-batch: alternating single/batched rounds per concurrency (median)",
    )
    bench.add_argument(
        "--no-baseline", action="store_true", help="skip the fresh-interpreter baselines"
    )
    bench.add_argument(
        "--ratio-rounds", type=int, default=3, help="alternating service/baseline rounds"
    )
    bench.add_argument(
        "--round-s", type=float, default=4.0, help="seconds of calls per alternating round"
    )
    bench.add_argument("--workers", type=int, default=None, help="workers of the private stack")
    bench.add_argument("--out", default="reports/bench", help="directory of the report and plot")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")

    mcp = sub.add_parser(
        "mcp", help="an MCP server on stdio whose python tools run on a running service"
    )
    mcp.add_argument(
        "--url", default=None, help="the service (default: RL_SANDBOX_URL, else 127.0.0.1:8000)"
    )
    mcp.add_argument("--max-timeout", type=float, default=60.0, help="the service's max_timeout")
    mcp.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        default="WARNING",
        help="what goes to stderr (default WARNING: every HTTP call is logged at INFO)",
    )

    train = sub.add_parser("train", help="GRPO-RoC training from a config file (rl extra)")
    source = train.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="run configuration (TOML)")
    source.add_argument(
        "--resume", metavar="RUN", help="run directory to go on with, from its latest checkpoint"
    )
    train.add_argument("--run-dir", default=None, help="output directory (default runs/<name>)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    evaluate = sub.add_parser(
        "eval", help="pass@1 of a checkpoint, averaged over k samples per problem"
    )
    evaluate.add_argument("--config", required=True, help="run configuration (TOML)")
    evaluate.add_argument(
        "--checkpoint", default=None, help="model directory (default: the config's model)"
    )
    evaluate.add_argument("--problems", default=None, help="problem file (default: the task's)")
    evaluate.add_argument("--samples", type=int, default=16, help="samples per problem (k)")
    evaluate.add_argument("--temperature", type=float, default=0.6, help="sampling temperature")
    evaluate.add_argument("--limit", type=int, default=0, help="first N problems only (0: all)")
    evaluate.add_argument("--out", required=True, help="directory for results.jsonl, summary")
    return parser


def _add_listen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default=None, help="address to listen on (default: RL_SANDBOX_HOST, 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=None, help="port to listen on (default: RL_SANDBOX_PORT, 8000)"
    )


def _settings(args: argparse.Namespace) -> Settings:
    from sandbox_service.settings import Settings

    overrides: dict[str, object] = {}
    if getattr(args, "workers", None) is not None:
        overrides["workers"] = args.workers
    return Settings(**overrides)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; a misspelled setting stops it with exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "mcp":
            return _mcp(args)
        from sandbox_service.settings import UnknownSettingError

        try:
            return _run(args)
        except UnknownSettingError as exc:
            print(f"rl-sandbox: {exc}", file=sys.stderr)
            return 2
    except BrokenPipeError:
        # The reader went away (`rl-sandbox run x.py | head`): what is left to print goes
        # nowhere, and the interpreter must not fail flushing stdout at exit either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _mcp(args: argparse.Namespace) -> int:
    from sandbox_service.api.compat.mcp_stdio import run_stdio

    url = args.url or os.environ.get("RL_SANDBOX_URL", "http://127.0.0.1:8000")
    api_key = os.environ.get("RL_SANDBOX_API_KEY")
    return run_stdio(url, api_key, args.max_timeout, args.log_level)


def _run(args: argparse.Namespace) -> int:
    if args.command == "run":
        from sandbox_service.local.run_once import run_once

        return run_once(args)
    if args.command == "train":
        from rl.run.trainer import train_command

        return train_command(
            args.config, run_dir=args.run_dir, progress=not args.no_progress, resume=args.resume
        )
    if args.command == "eval":
        from rl.run.evaluate import eval_command

        return eval_command(args)
    if args.command == "bench":
        from sandbox_service.bench.command import bench_command

        return bench_command(args)
    settings = _settings(args)
    if args.command == "up":
        from sandbox_service.local.up import up

        return up(settings, args.host or settings.host, args.port or settings.port)
    if args.command == "api":
        from sandbox_service.api.server import serve

        return serve(settings, args.host or settings.host, args.port or settings.port)
    if args.command == "worker-health":
        from sandbox_service.worker.health import worker_health

        return worker_health(settings)
    if args.command == "worker":
        from sandbox_service.logs import configure_logging
        from sandbox_service.worker.supervisor import run_workers

        configure_logging("worker-supervisor", settings.log_level)
        return run_workers(settings, settings.workers)
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
