"""The Grafana dashboard and the Prometheus alert rules of deploy/monitoring/, offline.

Both files parse and have the shape their tool loads; every PromQL expression parses with
promql-parser (the Rust `promql-parser` crate that GreptimeDB uses, which follows Prometheus'
grammar; Grafana's `$variables` are substituted first, as Grafana does before sending a query);
and every metric an expression selects is one that the service exports: a name in the exposition
of `sandbox_service.api.metrics.Metrics`, or, in tests/service, of a real service's /metrics.
That exposition is the open one, of aggregates only: an expression naming a `tenant` label is
refused too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import promql_parser
import yaml

DASHBOARD = Path("deploy/monitoring/grafana-dashboard.json")
ALERTS = Path("deploy/monitoring/alerts.yaml")
SEVERITIES = ("critical", "warning", "info")
_GRAFANA_INTERVAL = re.compile(r"\$__(rate_interval|interval|range)\b")
_GRAFANA_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")
_TENANT_LABEL = re.compile(r"\btenant\b")


def exported_names(exposition: str) -> set[str]:
    """The names a query can select in a Prometheus text exposition, from its TYPE lines
    (a histogram's `_bucket`, `_count` and `_sum`), whether or not a family has samples yet."""
    names = set()
    for line in exposition.splitlines():
        words = line.split()
        if words[:2] != ["#", "TYPE"] or len(words) != 4:
            continue
        name, kind = words[2], words[3]
        if kind in ("histogram", "summary"):
            names.update(name + suffix for suffix in _HISTOGRAM_SUFFIXES)
        else:
            names.add(name)
    return names


def defined_names() -> set[str]:
    """Every name the service's metric definitions export (rendered, no service needed)."""
    from sandbox_service.api.metrics import Metrics

    return exported_names(Metrics().render().decode())


def selected_metrics(expr: str) -> tuple[set[str], str | None]:
    """(metric names `expr` selects, None) or (empty, why it does not parse)."""
    try:
        ast = promql_parser.parse(expr)
    except ValueError as exc:
        return set(), str(exc)
    names: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            names.update(m.value for m in node.matchers.matchers if m.name == "__name__")
        return True

    promql_parser.walk(ast, visit)
    return names, None


def grafana_to_promql(expr: str, variables: set[str]) -> tuple[str, list[str]]:
    """`expr` as Grafana sends it (intervals and template variables substituted), and the
    variables it uses that the dashboard does not define."""
    undefined = []

    def variable(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in variables:
            undefined.append(name)
        return ".*"

    return _GRAFANA_VARIABLE.sub(variable, _GRAFANA_INTERVAL.sub("5m", expr)), undefined


def _expr_problems(where: str, expr: str, known: set[str]) -> list[str]:
    names, error = selected_metrics(expr)
    if error is not None:
        return [f"{where}: PromQL does not parse: {error}"]
    out = [f"{where}: selects {name}, which the service does not export" for name in names - known]
    if not names:
        out.append(f"{where}: selects no metric")
    if _TENANT_LABEL.search(expr):
        out.append(
            f"{where}: names a `tenant` label, which the scraped /metrics does not carry "
            "(per-tenant series are served by /metrics/tenants to a key)"
        )
    return out


def _panels(panels: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_problems(path: Path, known: set[str]) -> list[str]:
    """Problems of a Grafana dashboard JSON file."""
    try:
        dashboard = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [f"{path}: {exc}"]
    out = [f"{path}: no {key}" for key in ("uid", "title", "schemaVersion") if key not in dashboard]
    variables = {v["name"] for v in dashboard.get("templating", {}).get("list", [])}
    if "datasource" not in variables:
        out.append(f"{path}: no `datasource` variable (panels name their data source by it)")
    ids = [p.get("id") for p in _panels(dashboard.get("panels", []))]
    if len(ids) != len(set(ids)):
        out.append(f"{path}: panel ids repeat")
    for panel in _panels(dashboard.get("panels", [])):
        where = f"{path}: panel {panel.get('title')!r}"
        grid = panel.get("gridPos", {})
        if grid.get("x", 0) + grid.get("w", 0) > 24:
            out.append(f"{where}: wider than the 24-column grid")
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets", [])
        if not targets:
            out.append(f"{where}: no query")
        for target in targets:
            expr, undefined = grafana_to_promql(target.get("expr", ""), variables)
            out += [
                f"{where}: uses ${name}, which the dashboard does not define" for name in undefined
            ]
            out += _expr_problems(f"{where} {target.get('refId')}", expr, known)
    return out


def alert_problems(path: Path, known: set[str]) -> list[str]:
    """Problems of a Prometheus rule file."""
    try:
        rules_file = yaml.safe_load(path.read_text())
        groups = rules_file["groups"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        return [f"{path}: not a rule file: {exc}"]
    out: list[str] = []
    seen: set[str] = set()
    for group in groups:
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            where = f"{path}: {name}"
            if not name or name in seen:
                out.append(f"{where}: a rule needs a unique alert (or record) name")
            seen.add(str(name))
            unknown = set(rule) - {
                "alert",
                "record",
                "expr",
                "for",
                "keep_firing_for",
                "labels",
                "annotations",
            }
            out += [f"{where}: unknown field {key}" for key in sorted(unknown)]
            out += _expr_problems(where, str(rule.get("expr", "")), known)
            if "for" in rule:
                try:
                    promql_parser.parse_duration(str(rule["for"]))
                except ValueError as exc:
                    out.append(f"{where}: for: {exc}")
            if "alert" in rule:
                if rule.get("labels", {}).get("severity") not in SEVERITIES:
                    out.append(f"{where}: labels.severity must be one of {', '.join(SEVERITIES)}")
                if not rule.get("annotations", {}).get("summary"):
                    out.append(f"{where}: no annotations.summary")
    return out


def check(root: Path, known: set[str] | None = None) -> list[str]:
    """Problems of deploy/monitoring/ (against the service's metric definitions by default)."""
    names = defined_names() if known is None else known
    return dashboard_problems(root / DASHBOARD, names) + alert_problems(root / ALERTS, names)
