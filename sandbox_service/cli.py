"""The `rl-sandbox` command: one subcommand per way of running the sandbox."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sandbox_service.settings import Settings, UnknownSettingError


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

    up = sub.add_parser(
        "up", help="run everything locally: private Redis (unless REDIS_URL), workers, API"
    )
    _add_listen_arguments(up)
    up.add_argument("--workers", type=int, default=None, help="worker processes (default: cores)")

    api = sub.add_parser("api", help="run the HTTP API against REDIS_URL")
    _add_listen_arguments(api)

    worker = sub.add_parser("worker", help="run this host's worker processes against REDIS_URL")
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
    bench.add_argument("--workers", type=int, default=None, help="workers of the private stack")
    bench.add_argument("--out", default="reports/bench", help="directory of the report and plot")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")

    mcp = sub.add_parser(
        "mcp", help="an MCP server on stdio whose python tools run on a running service (mcp extra)"
    )
    mcp.add_argument(
        "--url", default=None, help="the service (default: RL_SANDBOX_URL, else 127.0.0.1:8000)"
    )
    mcp.add_argument("--max-timeout", type=float, default=60.0, help="the service's max_timeout")

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
    overrides: dict[str, object] = {}
    if getattr(args, "workers", None) is not None:
        overrides["workers"] = args.workers
    return Settings(**overrides)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; a misspelled setting stops it with exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except UnknownSettingError as exc:
        print(f"rl-sandbox: {exc}", file=sys.stderr)
        return 2


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
    if args.command == "mcp":
        import os

        from sandbox_service.api.compat.mcp_server import run_stdio

        url = args.url or os.environ.get("RL_SANDBOX_URL", "http://127.0.0.1:8000")
        return run_stdio(url, os.environ.get("RL_SANDBOX_API_KEY"), args.max_timeout)
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
