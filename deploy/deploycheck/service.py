"""The service's side of the contract that deploy files must keep: its CLI and its settings."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Iterator, Mapping, Sequence

from pydantic import ValidationError

from sandbox_service.cli import build_parser
from sandbox_service.settings import Settings, setting_env_names

CLI = "rl-sandbox"
WRAPPER = "rl-sandbox-worker-entrypoint"
"""The worker image's entry point: prepares cgroups and /proc for nsjail, then execs its args."""

WORKER_CAPABILITIES = frozenset({"SETGID", "SETUID", "SYS_ADMIN"})
"""What the worker container may add, no more and no less: docs/deploy.md explains each one
(and how each was found necessary, and CHOWN, DAC_OVERRIDE, FOWNER, KILL unnecessary)."""

_SECRET_WORDS = ("KEY", "SECRET", "PASSWORD", "PASSWD", "TOKEN", "CREDENTIAL")


def parse_command(
    argv: Sequence[str], subcommand: str, where: str
) -> tuple[argparse.Namespace | None, list[str]]:
    """Parse a container's argv, which must be `[wrapper] rl-sandbox <subcommand> ...`."""
    args = list(argv[1:]) if argv[:1] == [WRAPPER] else list(argv)
    if args[:1] != [CLI] or args[1:2] != [subcommand]:
        return None, [f"{where}: runs {list(argv)!r}, expected `{CLI} {subcommand}`"]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(args[1:]), []
    except SystemExit:
        reason = err.getvalue().strip().splitlines()[-1:] or ["rejected"]
        return None, [f"{where}: `{' '.join(args)}` is refused by the CLI: {reason[0]}"]


def command_problems(argv: Sequence[str], subcommand: str, where: str) -> list[str]:
    """Problems with a container's argv (see parse_command)."""
    return parse_command(argv, subcommand, where)[1]


def effective(args: argparse.Namespace | None, settings: Settings) -> tuple[Settings, str, int]:
    """The settings a command runs with and the address it listens on: its flags win over the
    environment, as in cli.py (`--workers`, `--host`, `--port`)."""
    workers = getattr(args, "workers", None)
    if workers is not None:
        settings = settings.model_copy(update={"workers": workers})
    host = getattr(args, "host", None) or settings.host
    port = getattr(args, "port", None) or settings.port
    return settings, host, port


@contextlib.contextmanager
def _only_env(env: Mapping[str, str]) -> Iterator[None]:
    # Settings read os.environ: hide this process's own settings while building the container's.
    names = setting_env_names()
    saved = {k: v for k, v in os.environ.items() if k.upper() in names}
    for key in saved:
        del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        for key in env:
            os.environ.pop(key, None)
        os.environ.update(saved)


def settings_for(env: Mapping[str, str | None], where: str) -> tuple[Settings | None, list[str]]:
    """The Settings a container with this environment builds, or the problems that stop it."""
    names = setting_env_names()
    problems = [
        f"{where}: {key} is not a setting (known: RL_SANDBOX_<FIELD> of settings.py, REDIS_URL)"
        for key in env
        if key.upper().startswith("RL_SANDBOX_") and key.upper() not in names
    ]
    given = {k: v for k, v in env.items() if k.upper() in names and v is not None}
    with _only_env(given):
        try:
            return Settings(), problems
        except ValidationError as exc:
            errors = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
            )
            return None, [*problems, f"{where}: the settings are invalid: {errors}"]


def secret_problems(env_names: Sequence[str], where: str) -> list[str]:
    """The worker's environment must hold no secret: it needs none, and only the API checks keys."""
    return [
        f"{where}: {name} looks like a secret; the worker must not be given one"
        for name in env_names
        if any(word in name.upper() for word in _SECRET_WORDS)
    ]


def capability_problems(added: Sequence[str], dropped: Sequence[str], where: str) -> list[str]:
    """The worker drops every capability and adds back exactly WORKER_CAPABILITIES."""
    problems = []
    norm = {c.upper().removeprefix("CAP_") for c in added}
    if "ALL" not in {c.upper() for c in dropped}:
        problems.append(f"{where}: must drop ALL capabilities before adding nsjail's")
    if extra := sorted(norm - WORKER_CAPABILITIES):
        problems.append(f"{where}: adds {extra}, beyond what nsjail needs (docs/deploy.md)")
    if missing := sorted(WORKER_CAPABILITIES - norm):
        problems.append(f"{where}: lacks {missing}, which nsjail needs (docs/deploy.md)")
    return problems


def queue_key(settings: Settings) -> str:
    """The Redis list RQ keeps the queue in: its length is the autoscaling signal."""
    try:
        from sandbox_service.keys import rq_queue
    except ImportError:  # keys.py is the one place that names Redis keys, where it exists
        return f"rq:queue:{settings.queue_name}"
    return rq_queue(settings.queue_name)
