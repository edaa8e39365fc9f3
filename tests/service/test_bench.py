"""`rl-sandbox bench` machinery on a tiny sweep against the real stack: structure, never timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox_service.bench.command import BenchOptions, run_bench
from sandbox_service.bench.http import NotLoopback, loopback_target
from sandbox_service.bench.workloads import WORKLOADS
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
        ("service round", "print"), ("baseline round", "print"),
        ("service round", "flood"), ("baseline round", "flood"),
    ]  # fmt: skip
    assert [(p["workload"], p["concurrency"]) for p in service] == [
        ("print", 1), ("print", 3), ("flood", 1), ("flood", 3)
    ]  # fmt: skip
    assert {p["workload"] for p in baseline} == {"print", "flood"}
    assert all(p["calls"] >= p["concurrency"] for p in points)
    assert [p["first_failure"] for p in points if p["failed"]] == []
    for p in service:
        assert p["p50_ms"] <= p["p99_ms"]
        assert set(p["cpu_ms_per_call"]) >= {"api", "bench", "total"}
        assert set(p["rss_mb"]["api"]) == {"start", "max", "end"}
    assert {r["workload"] for r in report["ratios"]} == {"print", "flood"}
    for ratio in report["ratios"]:
        assert ratio["throughput_ratio"] > 0 and ratio["cpu_ratio"] > 0
        assert len(ratio["interleaved_ratios"]) == 1 and ratio["interleaved_ratio_median"] > 0
    assert all(p["cpu_ms_per_call"]["python -c"] > 0 for p in baseline)

    assert json.loads((tmp_path / "bench.json").read_text()) == {
        k: v for k, v in report.items() if k != "plot"
    }
    assert "| workload | service best/s" in (tmp_path / "bench.md").read_text()
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
