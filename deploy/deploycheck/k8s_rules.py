"""The rules a rendered kustomization must keep, beyond its schemas.

Workloads: selectors select, images are pinned, every container has requests and a memory limit,
no service-account token, no service links. API and worker containers: their commands parse with
the CLI, their environment builds valid Settings; the API is unprivileged and probed on /healthz
and /readyz; every HTTP probe and scrape annotation names a path served without the API key
(a kubelet or a Prometheus cannot send one: a probe of an authenticated path never passes);
the worker has exactly the documented capabilities, no secret, room for its slots.
Wiring: Services, autoscalers and PodDisruptionBudgets point at real pods, the API's Redis URLs
(REDIS_URL, RL_SANDBOX_CELLS) name Services, KEDA watches the queue the workers it scales serve in
their own Redis, NetworkPolicies deny by default, namespaces admit the worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from deploycheck import dockerfile, seccomp
from deploycheck.service import (
    capability_problems,
    effective,
    parse_command,
    queue_key,
    secret_problems,
    settings_for,
)
from sandbox_service.api.edge import OPEN_PATHS
from sandbox_service.settings import Settings

Obj = dict[str, Any]

IMAGE_TARGETS = {"rl-sandbox-api": "api", "rl-sandbox-worker": "worker", "rl-sandbox": "standalone"}
"""Image name -> the Dockerfile target it is built from."""


@dataclass
class Objects:
    """One rendering, indexed for the rules."""

    objs: list[Obj]
    stages: dict[str, dockerfile.Stage]

    def of(self, kind: str) -> list[Obj]:
        """Objects of one kind."""
        return [o for o in self.objs if o.get("kind") == kind]

    def config_maps(self) -> dict[str, dict[str, str]]:
        """ConfigMap data by (rendered, hash-suffixed) name."""
        return {o["metadata"]["name"]: o.get("data") or {} for o in self.of("ConfigMap")}

    def pods_of(self, selector: Obj | None) -> list[Obj]:
        """Deployments whose pods a label selector selects."""
        return [d for d in self.of("Deployment") if selects(selector, pod_labels(d))]


def name(obj: Obj) -> str:
    """Kind/name, for messages."""
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def targets(deployment: Obj) -> set[str | None]:
    """The Dockerfile targets of a Deployment's containers (None: not one of our images)."""
    return {
        IMAGE_TARGETS.get(c.get("image", "").rsplit("/", 1)[-1].split("@")[0].split(":")[0])
        for c in deployment["spec"]["template"]["spec"].get("containers", [])
    }


def pod_labels(deployment: Obj) -> dict[str, str]:
    """The labels of a Deployment's pods."""
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"].get("labels", {})
    return labels


def selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    """Whether a matchLabels selector selects these labels (an empty one selects nothing here)."""
    match = (selector or {}).get("matchLabels") or {}
    return bool(match) and all(labels.get(k) == v for k, v in match.items())


def quantity(text: str | float | None) -> float:
    """A Kubernetes quantity as a number: cores for cpu ("500m"), bytes for memory ("2Gi")."""
    s = str(text or "0")
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 1e-3, "k": 1e3, "M": 1e6,
             "G": 1e9, "T": 1e12}  # fmt: skip
    for unit, factor in units.items():
        if s.endswith(unit):
            return float(s[: -len(unit)]) * factor
    return float(s)


def rule_problems(objs: list[Obj], stages: dict[str, dockerfile.Stage]) -> list[str]:
    """Every rule over one rendering."""
    r = Objects(objs, stages)
    out: list[str] = []
    workers: dict[str, Settings] = {}
    for dep in r.of("Deployment"):
        problems, settings = _workload(r, dep)
        out += [f"{name(dep)}: {p}" for p in problems]
        if "worker" in targets(dep) and settings is not None:
            workers[dep["metadata"]["name"]] = settings
    out += _services(r) + _scalers(r, workers) + _budgets(r) + _policies(r) + _namespaces(r)
    return out


def _workload(r: Objects, dep: Obj) -> tuple[list[str], Settings | None]:
    pod = dep["spec"]["template"]["spec"]
    out = []
    if not selects(dep["spec"].get("selector"), pod_labels(dep)):
        out.append("spec.selector does not select the pod template's labels")
    if pod.get("automountServiceAccountToken") is not False:
        out.append("set automountServiceAccountToken: false (no pod talks to the API server)")
    if pod.get("enableServiceLinks") is not False:
        # Service links put <SERVICE>_PORT=tcp://... in the environment; for Services named
        # rl-sandbox-* those share the RL_SANDBOX_ prefix of the settings.
        out.append("set enableServiceLinks: false (service variables collide with settings)")
    settings = None
    annotations = (dep["spec"]["template"].get("metadata") or {}).get("annotations") or {}
    scrape_path = annotations.get("prometheus.io/path")
    if annotations.get("prometheus.io/scrape") == "true" and (scrape_path or "/metrics") not in (
        OPEN_PATHS
    ):
        out.append(f"prometheus.io/path {scrape_path} needs the API key: scrapers cannot send one")
    for c in pod.get("containers", []):
        image = c.get("image", "")
        if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest"):
            out.append(f"container {c['name']}: pin the image tag ({image!r})")
        res = c.get("resources") or {}
        for group, what in (("requests", "cpu"), ("requests", "memory"), ("limits", "memory")):
            if what not in (res.get(group) or {}):
                out.append(f"container {c['name']}: set resources.{group}.{what}")
        target = IMAGE_TARGETS.get(image.rsplit("/", 1)[-1].split("@")[0].split(":")[0])
        if target not in ("worker", "standalone"):
            # Only the worker needs privileges (nsjail); everything else runs fully confined.
            sc = {**(pod.get("securityContext") or {}), **(c.get("securityContext") or {})}
            if (sc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
                out.append(f"container {c['name']}: use the RuntimeDefault seccomp profile")
            if sc.get("allowPrivilegeEscalation") is not False:
                out.append(f"container {c['name']}: set allowPrivilegeEscalation: false")
            if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
                out.append(f"container {c['name']}: drop ALL capabilities")
        out += [f"container {c['name']}: {p}" for p in open_path_problems(c)]
        if target is not None:
            problems, settings = _service_container(r, pod, c, target)
            out += [f"container {c['name']}: {p}" for p in problems]
    return out, settings


PROBES = ("startupProbe", "livenessProbe", "readinessProbe")


def open_path_problems(c: Obj) -> list[str]:
    """HTTP probes must GET a path served without the API key (edge.OPEN_PATHS)."""
    out = []
    for probe in PROBES:
        get = (c.get(probe) or {}).get("httpGet")
        if get is not None and get.get("path", "/") not in OPEN_PATHS:
            out.append(
                f"{probe} GETs {get.get('path', '/')}, which needs the API key: it never passes "
                f"when a key is set (open paths: {', '.join(sorted(OPEN_PATHS))})"
            )
    return out


def _env(r: Objects, c: Obj) -> tuple[dict[str, str], list[str], list[str]]:
    """The container's environment, the names that come from Secrets, and dangling references."""
    maps = r.config_maps()
    env: dict[str, str] = {}
    from_secrets, dangling = [], []
    for src in c.get("envFrom") or []:
        if "configMapRef" in src:
            ref = src["configMapRef"]["name"]
            if ref not in maps:
                dangling.append(f"envFrom names ConfigMap {ref}, which is not rendered")
            env.update(maps.get(ref, {}))
        else:
            from_secrets.append(f"envFrom {src}")
    for item in c.get("env") or []:
        ref = item.get("valueFrom") or {}
        if "configMapKeyRef" in ref:
            key = ref["configMapKeyRef"]
            env[item["name"]] = maps.get(key["name"], {}).get(key["key"], "")
        elif "secretKeyRef" in ref:
            env[item["name"]] = "from-a-secret"
            from_secrets.append(item["name"])
        else:
            env[item["name"]] = str(item.get("value", ""))
    return env, from_secrets, dangling


def _service_container(
    r: Objects, pod: Obj, c: Obj, target: str
) -> tuple[list[str], Settings | None]:
    stage = r.stages[target]
    argv = dockerfile.image_argv(stage, c.get("command"), c.get("args"))
    args, out = parse_command(argv, dockerfile.TARGETS[target], "command")
    env, from_secrets, dangling = _env(r, c)
    built, problems = settings_for({**stage.env, **env}, "environment")
    out += dangling + problems
    if built is None:
        return out, None
    settings, host, port = effective(args, built)
    services = {s["metadata"]["name"] for s in r.of("Service")}
    cells = settings.cell_urls() if target == "api" else (settings.redis_url or "",)
    for url in cells or ("",):
        redis_host = urlparse(url).hostname or ""
        if "." not in redis_host and redis_host not in services:
            out.append(f"Redis URL {url!r}: no Service {redis_host!r} here (nor an outside host)")
    sc = {**(pod.get("securityContext") or {}), **(c.get("securityContext") or {})}
    grace_s = pod.get("terminationGracePeriodSeconds", 30)
    if target == "api":
        out += _api(c, sc, settings, host, port, grace_s)
    elif target == "worker":
        out += _worker(c, sc, settings, grace_s, list(env), from_secrets)
    return out, settings


def _api(c: Obj, sc: Obj, settings: Settings, host: str, port: int, grace_s: float) -> list[str]:
    out = []
    if host != "0.0.0.0":
        out.append(f"listens on {host}; in a pod use --host 0.0.0.0")
    ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
    if port not in ports.values():
        out.append(f"serves port {port}, which is no containerPort")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (c.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != path or ports.get(get.get("port"), get.get("port")) != port:
            out.append(f"{probe} must GET {path} on port {port}")
    for key, want in (
        ("runAsNonRoot", True),
        ("allowPrivilegeEscalation", False),
        ("readOnlyRootFilesystem", True),
    ):
        if sc.get(key) is not want:
            out.append(f"securityContext.{key} must be {want}")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []) or caps.get("add"):
        out.append("needs no capability: drop [ALL], add none")
    if grace_s < settings.shutdown_grace_s:
        out.append("terminationGracePeriodSeconds is under shutdown_grace_s")
    return out


def _worker(
    c: Obj, sc: Obj, settings: Settings, grace_s: float, env: list[str], from_secrets: list[str]
) -> list[str]:
    out = secret_problems(env, "environment")
    out += [f"the worker must not be given secrets ({s})" for s in from_secrets]
    caps = sc.get("capabilities") or {}
    out += capability_problems(caps.get("add") or [], caps.get("drop") or [], "capabilities")
    if sc.get("privileged"):
        out.append("must not be privileged")
    profile = sc.get("seccompProfile") or {}
    if (profile.get("type"), profile.get("localhostProfile")) != (
        "Localhost",
        seccomp.K8S_LOCALHOST_PROFILE,
    ):
        out.append(
            f"seccompProfile must be Localhost {seccomp.K8S_LOCALHOST_PROFILE} (nsjail needs "
            "pivot_root, which RuntimeDefault forbids; Unconfined allows everything)"
        )
    if (sc.get("appArmorProfile") or {}).get("type") != "Unconfined":
        out.append("nsjail mounts, which the runtime's default AppArmor profile forbids")
    if not c.get("livenessProbe"):
        out.append("needs a livenessProbe (rl-sandbox worker-health)")
    if grace_s < settings.job_timeout_s(settings.max_timeout):
        out.append("terminationGracePeriodSeconds is shorter than the longest job")
    res = c.get("resources") or {}
    slots, per_slot_mb = settings.workers, settings.max_memory_mb
    if quantity((res.get("requests") or {}).get("cpu")) < slots:
        out.append(f"{slots} slots (RL_SANDBOX_WORKERS) need a cpu request of at least {slots}")
    if quantity((res.get("limits") or {}).get("memory")) < slots * per_slot_mb * 2**20:
        # Past it the pod's OOM killer takes the worker, not the program (status memory_limit).
        out.append(f"memory limit is under {slots} slots x max_memory_mb ({per_slot_mb} MiB)")
    return out


def _services(r: Objects) -> list[str]:
    out = []
    for svc in r.of("Service"):
        pods = r.pods_of({"matchLabels": svc["spec"].get("selector")})
        if not pods:
            out.append(f"{name(svc)}: selects no pods")
            continue
        known = {
            p.get(key)
            for d in pods
            for c in d["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
            for key in ("name", "containerPort")
        }
        for port in svc["spec"].get("ports", []):
            if port.get("targetPort", port["port"]) not in known:
                out.append(f"{name(svc)}: targetPort {port.get('targetPort')} is no container port")
    return out


def _scalers(r: Objects, workers: dict[str, Settings]) -> list[str]:
    out: list[str] = []
    deployments = {d["metadata"]["name"] for d in r.of("Deployment")}
    scaled: set[str] = set()
    for obj in r.of("HorizontalPodAutoscaler") + r.of("ScaledObject"):
        ref = obj["spec"]["scaleTargetRef"]
        if ref.get("kind", "Deployment") != "Deployment" or ref["name"] not in deployments:
            out.append(f"{name(obj)}: scales {ref}, which is no Deployment here")
        if ref["name"] in scaled:
            out.append(f"{name(obj)}: {ref['name']} already has an autoscaler")
        scaled.add(ref["name"])
    for so in r.of("ScaledObject"):
        worker = workers.get(so["spec"]["scaleTargetRef"]["name"])
        out += [f"{name(so)}: {p}" for p in _queue_trigger(r, so, worker)]
    return out


def _queue_trigger(r: Objects, so: Obj, worker: Settings | None) -> list[str]:
    triggers = [t for t in so["spec"].get("triggers", []) if t.get("type") == "redis"]
    if not triggers or worker is None:
        return ["needs a redis trigger on the queue of a worker Deployment"]
    out = []
    ns = so["metadata"].get("namespace")
    # The Redis of the workers it scales (their cell's), as a Service here or an outside host.
    url = urlparse(worker.redis_url or "")
    redis = [s for s in r.of("Service") if s["metadata"]["name"] == url.hostname]
    addresses = [
        f"{s['metadata']['name']}.{ns}.svc{suffix}:{p['port']}"
        for s in redis
        for p in s["spec"]["ports"]
        for suffix in ("", ".cluster.local")
    ] or [f"{url.hostname}:{url.port or 6379}"]
    for t in triggers:
        meta = t.get("metadata") or {}
        if meta.get("listName") != queue_key(worker):
            out.append(
                f"listName {meta.get('listName')!r}, the workers serve {queue_key(worker)!r}"
            )
        if addresses and meta.get("address") not in addresses:
            address = meta.get("address")
            out.append(f"address {address!r} is not the workers' Redis: {addresses[-1]}")
    redis_pods = [
        pod_labels(d) for s in redis for d in r.pods_of({"matchLabels": s["spec"].get("selector")})
    ]
    keda_allowed = any(
        selects(pol["spec"].get("podSelector"), labels) and _admits_namespace(pol, "keda")
        for pol in r.of("NetworkPolicy")
        for labels in redis_pods
    )
    if redis_pods and not keda_allowed:
        out.append("KEDA's operator reads Redis: a NetworkPolicy must admit namespace keda")
    return out


def _admits_namespace(policy: Obj, namespace: str) -> bool:
    return any(
        (peer.get("namespaceSelector") or {})
        .get("matchLabels", {})
        .get("kubernetes.io/metadata.name")
        == namespace
        for rule in policy["spec"].get("ingress", [])
        for peer in rule.get("from", [])
    )


def _budgets(r: Objects) -> list[str]:
    out, covered = [], set()
    for pdb in r.of("PodDisruptionBudget"):
        pods = r.pods_of(pdb["spec"].get("selector"))
        if not pods:
            out.append(f"{name(pdb)}: selects no pods")
        covered.update(d["metadata"]["name"] for d in pods)
    for dep in r.of("Deployment"):
        if targets(dep) & {"api", "worker"} and dep["metadata"]["name"] not in covered:
            out.append(f"{name(dep)}: needs a PodDisruptionBudget")
    return out


def _policies(r: Objects) -> list[str]:
    out = []
    policies = r.of("NetworkPolicy")
    deny_all = [
        p
        for p in policies
        if p["spec"].get("podSelector") == {}
        and set(p["spec"].get("policyTypes", [])) == {"Ingress", "Egress"}
        and not p["spec"].get("ingress")
        and not p["spec"].get("egress")
    ]
    if not deny_all:
        out.append("needs a default-deny NetworkPolicy (podSelector {}, Ingress and Egress)")
    for dep in r.of("Deployment"):
        if not any(selects(p["spec"].get("podSelector"), pod_labels(dep)) for p in policies):
            out.append(f"{name(dep)}: no NetworkPolicy opens what it needs")
    return out


def _namespaces(r: Objects) -> list[str]:
    out = []
    for ns in r.of("Namespace"):
        if ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") != (
            "privileged"
        ):
            out.append(f"{name(ns)}: the worker's capabilities need Pod Security `privileged`")
        strays = [
            name(o)
            for o in r.objs
            if o.get("kind") != "Namespace"
            and o["metadata"].get("namespace") != ns["metadata"]["name"]
        ]
        if strays:
            out.append(f"{name(ns)}: objects outside it: {strays}")
    return out
