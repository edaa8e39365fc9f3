"""The bench's single-against-batched comparison (bench/report.batching), on hand-made rows."""

from __future__ import annotations

from typing import Any

from sandbox_service.bench.report import batching


def row(batch: int, api: float, workers: float, redis: float, **extra: Any) -> dict[str, Any]:
    cpu = {"api": api, "workers": workers, "jail": 3.0, "redis": redis, "bench": 0.1, **extra}
    return {
        "target": "service",
        "workload": "print",
        "concurrency": 4,
        "batch": batch,
        "cpu_ms_per_call": cpu,
    }


def test_the_service_path_leaves_out_the_jail_and_the_bench() -> None:
    (entry,) = batching([row(1, 0.8, 1.0, 0.2), row(64, 0.2, 0.4, 0.1)])
    assert (entry["batch"], entry["single_ms"], entry["batched_ms"]) == (64, 2.0, 0.7)
    assert entry["batched_share"] == 0.35
    assert entry["batched_parts"] == {"api": 0.2, "workers": 0.4, "redis": 0.1}
    assert entry["merged"] is False


def test_points_of_other_concurrencies_or_without_workers_are_not_compared() -> None:
    other = {**row(64, 0.2, 0.4, 0.1), "concurrency": 16}
    api_only = {**row(64, 0.2, 0.4, 0.1), "cpu_ms_per_call": {"api": 0.2, "bench": 0.1}}
    assert batching([row(1, 0.8, 1.0, 0.2), other, api_only]) == []


def test_a_point_whose_jail_ended_is_flagged() -> None:
    merged = row(64, 0.2, 3.4, 0.1)
    del merged["cpu_ms_per_call"]["jail"]
    (entry,) = batching([row(1, 0.8, 1.0, 0.2), merged])
    assert entry["merged"] is True


def test_alternating_rounds_give_each_share_and_leave_out_a_round_whose_jail_ended() -> None:
    rounds = [
        {**row(1, 0.8, 1.0, 0.2), "target": "batch round"},
        {**row(64, 0.2, 0.4, 0.1), "target": "batch round"},  # 0.35
        {**row(1, 1.0, 1.6, 0.4), "target": "batch round"},
        {**row(64, 0.2, 0.6, 0.2), "target": "batch round"},  # 0.333
        {**row(1, 0.8, 1.0, 0.2), "target": "batch round"},
        {**row(64, 0.2, 3.4, 0.1), "target": "batch round"},  # merged below
        {**row(1, 0.6, 0.8, 0.1), "target": "batch round"},
        {**row(64, 0.1, 0.3, 0.1), "target": "batch round"},  # 0.333
    ]
    del rounds[5]["cpu_ms_per_call"]["jail"]
    (entry,) = batching([row(1, 0.8, 1.0, 0.2), row(64, 0.2, 0.4, 0.1), *rounds])
    assert entry["round_shares"] == [0.35, 0.333, 0.333]
    assert entry["round_share_median"] == 0.333
