"""The bench's calls per CPU-second against the fair baseline (bench/efficiency), on hand-made
rows."""

from __future__ import annotations

from typing import Any

from sandbox_service.bench.efficiency import calls_per_cpu_s, efficiency, table


def service(target: str, batch: int, total_ms: float, **cpu: float) -> dict[str, Any]:
    parts = cpu or {"api": 0.5, "workers": 0.5, "jail": total_ms - 1.0, "redis": 0.0}
    return {
        "target": target,
        "workload": "print",
        "baseline": "",
        "concurrency": 4,
        "batch": batch,
        "cpu_ms_per_call": {**parts, "bench": 0.3, "total": total_ms},
    }


def fresh(target: str, name: str, interpreters_ms: float) -> dict[str, Any]:
    return {
        "target": target,
        "workload": "print",
        "baseline": name,
        "concurrency": 2,
        "batch": 1,
        "cpu_ms_per_call": {"interpreters": interpreters_ms, "bench": 2.0, "total": 20.0},
    }


def test_the_service_counts_every_component_but_the_load_generator() -> None:
    assert calls_per_cpu_s(service("service", 1, 4.0)) == 250.0
    assert calls_per_cpu_s(fresh("baseline", "plain venv", 12.5)) == 80.0


def test_a_point_that_read_the_api_alone_gives_no_figure() -> None:
    assert calls_per_cpu_s(service("service", 1, 0.9, api=0.9)) is None
    assert calls_per_cpu_s({"cpu_ms_per_call": {}}) is None


def test_each_round_gives_a_ratio_per_batch_size_and_baseline_and_the_median_is_it() -> None:
    rows = [
        service("service", 1, 5.0),
        service("service", 64, 2.0),
        fresh("baseline", "plain venv", 10.0),
        # round 1
        service("service round", 1, 4.0),  # 250/s
        service("service round", 64, 1.0),  # 1000/s
        fresh("baseline round", "plain venv", 10.0),  # 100/s
        fresh("baseline round", "python -I -S", 5.0),  # 200/s
        # round 2
        service("service round", 1, 5.0),  # 200/s
        service("service round", 64, 2.0),  # 500/s
        fresh("baseline round", "plain venv", 20.0),  # 50/s
        fresh("baseline round", "python -I -S", 5.0),
        # round 3
        service("service round", 1, 2.0),  # 500/s
        service("service round", 64, 1.0),
        fresh("baseline round", "plain venv", 10.0),
        fresh("baseline round", "python -I -S", 4.0),  # 250/s
    ]
    entries = {(e["batch"], e["baseline"]): e for e in efficiency(rows)}
    assert set(entries) == {(b, n) for b in (1, 64) for n in ("plain venv", "python -I -S")}
    single = entries[1, "plain venv"]
    assert single["round_ratios"] == [2.5, 4.0, 5.0]
    assert single["ratio_median"] == 4.0
    assert (single["service_calls_per_cpu_s"], single["baseline_calls_per_cpu_s"]) == (250, 100)
    assert single["service_sweep_calls_per_cpu_s"] == [200.0]
    batched = entries[64, "plain venv"]
    assert batched["round_ratios"] == [10.0, 10.0, 10.0]
    assert batched["service_calls_per_cpu_s"] == 1000.0
    assert entries[64, "python -I -S"]["round_ratios"] == [5.0, 2.5, 4.0]
    text = "\n".join(table(efficiency(rows)))
    row = "| print | 64 | **1000.0** | plain venv | 100.0 | **10.0x** (10.0x, 10.0x, 10.0x)"
    assert row in text


def test_rounds_whose_service_read_the_api_alone_are_left_out() -> None:
    rows = [
        service("service round", 1, 0.9, api=0.9),
        fresh("baseline round", "plain venv", 10.0),
    ]
    assert efficiency(rows) == []
    assert table([]) == []
