"""deploy/monitoring/ (Grafana dashboard, Prometheus alert rules) passes its offline check, and
the check catches a broken expression, a metric the service does not export, an undefined
dashboard variable and an alert without severity. Against a real service's /metrics:
tests/service/test_worker_metrics.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("promql_parser", reason="needs the `deploy` extra (`make deploy-check`)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy"))

import yaml  # noqa: E402
from deploycheck import monitoring  # noqa: E402


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A copy of deploy/monitoring/ under tmp_path (the check's root)."""
    shutil.copytree(ROOT / "deploy" / "monitoring", tmp_path / "deploy" / "monitoring")
    return tmp_path


def _edit_dashboard(root: Path, expr: str) -> None:
    path = root / monitoring.DASHBOARD
    dashboard = json.loads(path.read_text())
    panel = next(p for p in dashboard["panels"] if p.get("targets"))
    panel["targets"][0]["expr"] = expr
    path.write_text(json.dumps(dashboard))


def _edit_first_alert(root: Path, **fields: object) -> None:
    path = root / monitoring.ALERTS
    rules = yaml.safe_load(path.read_text())
    rules["groups"][0]["rules"][0].update(fields)
    path.write_text(yaml.safe_dump(rules))


def test_the_dashboard_and_rules_pass() -> None:
    assert monitoring.check(ROOT) == []


def test_they_use_the_workers_metrics() -> None:
    text = (ROOT / monitoring.DASHBOARD).read_text() + (ROOT / monitoring.ALERTS).read_text()
    for name in (
        "rl_sandbox_worker_jobs_total",
        "rl_sandbox_worker_jail_cpu_seconds_total",
        "rl_sandbox_worker_sessions",
        "rl_sandbox_worker_session_restores_total",
        "rl_sandbox_worker_jail_recycles_total",
        "rl_sandbox_worker_start_time_seconds",
    ):
        assert name in text, name


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("sum(rate(rl_sandbox_executions_total[5m])", "does not parse"),
        ("rate(rl_sandbox_run_seconds_count[$__rate_interval])", "does not export"),
        ('rl_sandbox_worker_sessions{worker=~"$host"}', "does not define"),
        ("vector(1)", "selects no metric"),
        ("sum by (tenant) (rate(rl_sandbox_executions_total[5m]))", "`tenant` label"),
        ("rate(rl_sandbox_tenant_executions_total[5m])", "does not export"),
    ],
)
def test_a_broken_panel_query_is_caught(copy: Path, expr: str, problem: str) -> None:
    _edit_dashboard(copy, expr)
    problems = monitoring.check(copy)
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"expr": "max(rl_sandbox_queue_depth) > 1"}, "does not export"),
        ({"expr": "max(rl_sandbox_workers_alive) <"}, "does not parse"),
        ({"labels": {}}, "severity"),
        ({"for": "ten minutes"}, "for:"),
        ({"expresion": "up"}, "unknown field"),
    ],
)
def test_a_broken_alert_is_caught(copy: Path, fields: dict[str, object], problem: str) -> None:
    _edit_first_alert(copy, **fields)
    problems = monitoring.check(copy)
    assert any(problem in p for p in problems), problems


def test_exported_names_come_from_type_lines() -> None:
    text = "# TYPE a_total counter\n# TYPE b_seconds histogram\n# TYPE c gauge\nc 1\n"
    assert monitoring.exported_names(text) == {
        "a_total", "b_seconds_bucket", "b_seconds_count", "b_seconds_sum", "c",
    }  # fmt: skip
