"""`rl-sandbox bench` machinery on a tiny sweep against the real stack: structure, never timing."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox_service.bench.baseline import baselines
from sandbox_service.bench.command import BenchOptions, run_bench
from sandbox_service.bench.http import NotLoopback, loopback_target
from sandbox_service.bench.workloads import WORKLOADS
from tests.host_tag import tagged
from tests.service.stack import Stack


def test_a_tiny_sweep_answers_every_call_right_and_reports_ratios(
    stack: Stack, tmp_path: Path
) -> None:
    options = BenchOptions(
        workloads=("print", "flood"),
        concurrency=(1, 3),
        point_s=0.3,
        max_calls=6,
        baseline_point_s=0.1,
        ratio_rounds=1,
        round_s=0.1,
        url=stack.url,
        progress=False,
    )
    report = run_bench(options, tmp_path)

    points = report["points"]
    service = [p for p in points if p["target"] == "service"]
    baseline = [p for p in points if p["target"] == "baseline"]
    rounds = [(p["target"], p["workload"]) for p in points if p["target"].endswith("round")]
    assert rounds == [
        ("service round", "print"), ("baseline round", "print"), ("baseline round", "print"),
        ("service round", "flood"), ("baseline round", "flood"), ("baseline round", "flood"),
    ]  # fmt: skip
    assert [(p["workload"], p["concurrency"]) for p in service] == [
        ("print", 1), ("print", 3), ("flood", 1), ("flood", 3)
    ]  # fmt: skip
    assert {(p["workload"], p["baseline"]) for p in baseline} == {
        (w, b) for w in ("print", "flood") for b in ("plain venv", "python -I -S")
    }
    assert all(p["calls"] >= p["concurrency"] for p in points)
    assert [p["first_failure"] for p in points if p["failed"]] == []
    for p in service:
        assert p["p50_ms"] <= p["p99_ms"]
        assert set(p["cpu_ms_per_call"]) >= {"api", "bench", "total"}
        assert set(p["rss_mb"]["api"]) == {"start", "max", "end"}
    assert {(r["workload"], r["baseline"]) for r in report["ratios"]} == {
        (w, b) for w in ("print", "flood") for b in ("plain venv", "python -I -S")
    }
    for ratio in report["ratios"]:
        assert ratio["throughput_ratio"] > 0 and ratio["cpu_ratio"] > 0
        assert len(ratio["interleaved_ratios"]) == 1 and ratio["interleaved_ratio_median"] > 0
    assert all(p["cpu_ms_per_call"]["interpreters"] > 0 for p in baseline)

    assert json.loads((tmp_path / "bench.json").read_text()) == {
        k: v for k, v in report.items() if k != "plot"
    }
    assert "| workload | baseline | service best/s" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_batched_sweep_counts_calls_not_requests(stack: Stack, tmp_path: Path) -> None:
    options = BenchOptions(
        workloads=("print",),
        concurrency=(2,),
        point_s=0.2,
        max_calls=8,
        batch=4,
        baseline=False,
        url=stack.url,
        progress=False,
    )
    (point,) = run_bench(options, tmp_path)["points"]
    assert (point["batch"], point["failed"], point["first_failure"]) == (4, 0, "")
    assert point["calls"] >= 8 and point["calls"] % 4 == 0


def test_the_plain_venv_has_the_same_libraries_and_not_this_project(tmp_path: Path) -> None:
    plain = baselines()[0]
    probe = (
        "import importlib.util as u, importlib.metadata as m, sys\n"
        "print(sys.prefix != sys.base_prefix, u.find_spec('sandbox_service') is None,"
        " [m.version(p) for p in ('sympy', 'numpy', 'mpmath')])"
    )
    out = subprocess.run(
        [*plain.argv, probe], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    here = [importlib.metadata.version(p) for p in ("sympy", "numpy", "mpmath")]
    assert out == f"True True {here}\n"


def test_only_stdlib_workloads_run_on_the_bare_interpreter() -> None:
    (plain, bare) = baselines()
    assert "-S" in bare.argv and bare.stdlib_only and not plain.stdlib_only
    bare_ok = {name for name, w in WORKLOADS.items() if w.stdlib_only}
    assert bare_ok == {"print", "flood"}
    for name in bare_ok:
        code = WORKLOADS[name].code(3)
        done = subprocess.run([*bare.argv, code], capture_output=True, text=True, check=True)
        assert WORKLOADS[name].check(3, {"status": "ok", "stdout": done.stdout,
                                         "stdout_truncated": False}) is None  # fmt: skip


def test_every_workload_checks_its_own_answer() -> None:
    for workload in WORKLOADS.values():
        right = {"status": "ok", "stdout": workload.expected_stdout(7), "stdout_truncated": False}
        assert workload.check(7, right) is None
        assert workload.check(8, {**right, "stdout": workload.expected_stdout(9)}) is not None
        assert workload.check(7, {**right, "status": "error"}) is not None


@pytest.mark.parametrize(
    "url", ["http://10.0.0.1:8000", "https://127.0.0.1:8000", "http://example.com", "ftp://x"]
)
def test_only_plain_http_on_loopback_is_benchmarked(url: str) -> None:
    with pytest.raises(NotLoopback):
        loopback_target(url)
    assert loopback_target("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert loopback_target("http://localhost") == ("localhost", 80)


def compare_batch(stack: Stack, **overrides: Any) -> BenchOptions:
    """A short single-against-batches-of-4 run against the test stack."""
    return dataclasses.replace(
        BenchOptions(
            workloads=("print",),
            concurrency=(2,),
            point_s=0.2,
            max_calls=8,
            compare_batch=4,
            baseline=False,
            url=stack.url,
            progress=False,
        ),
        **overrides,
    )


def test_compare_batch_measures_each_point_single_then_batched(
    stack: Stack, tmp_path: Path
) -> None:
    points = run_bench(compare_batch(stack), tmp_path)["points"]
    assert [(p["target"], p["batch"], p["failed"]) for p in points] == [
        ("service", 1, 0),
        ("service", 4, 0),
    ]


def test_batch_rounds_alternate_single_and_batched_and_report_each_share(
    stack: Stack, tmp_path: Path
) -> None:
    options = compare_batch(stack, batch_rounds=2, round_s=0.3)
    report = run_bench(options, tmp_path)
    rounds = [(p["target"], p["batch"], p["failed"]) for p in report["points"][2:]]
    assert rounds == [("batch round", 1, 0), ("batch round", 4, 0)] * 2
    assert all(p["calls"] > 0 for p in report["points"][2:]), report["points"]


def test_a_private_stack_reports_calls_per_cpu_second_single_and_batched_beside_the_baselines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RL_SANDBOX_CGROUP_PARENT", tagged("rl-sandbox-bench-test"))
    monkeypatch.setenv("RL_SANDBOX_SANDBOX_UID_BASE", "63800")
    options = BenchOptions(
        workloads=("print",),
        concurrency=(2,),
        point_s=0.3,
        max_calls=8,
        baseline_point_s=0.1,
        ratio_rounds=2,
        round_s=0.3,
        compare_batch=4,
        workers=1,
        progress=False,
    )
    report = run_bench(options, tmp_path)

    assert [p["first_failure"] for p in report["points"] if p["failed"]] == []
    rounds = [p for p in report["points"] if p["target"] == "service round"]
    assert [p["batch"] for p in rounds] == [1, 4, 1, 4]
    assert all({"api", "workers", "redis", "total"} <= set(p["cpu_ms_per_call"]) for p in rounds)
    entries = {(e["batch"], e["baseline"]): e for e in report["efficiency"]}
    assert set(entries) == {(b, n) for b in (1, 4) for n in ("plain venv", "python -I -S")}
    for entry in entries.values():
        assert len(entry["round_ratios"]) == 2 and entry["ratio_median"] > 0
        assert entry["service_calls_per_cpu_s"] > 0 and entry["baseline_calls_per_cpu_s"] > 0
        assert len(entry["service_sweep_calls_per_cpu_s"]) == 1
    assert "| print | 4 | **" in (tmp_path / "bench.md").read_text()
