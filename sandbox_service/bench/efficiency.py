"""Calls per CPU-second: the bench's figure that other load on the machine barely moves.

The service's is the whole stack's (API, workers, jails, Redis: every process the bench samples
but its own load generator); a fair baseline's is its fresh interpreters' own CPU (the bench's
spawning of them left out too). Each alternating round (command.py's ratio rounds: the service
at each calls-per-request size, then every baseline) gives one ratio; the median round is the
figure, beside the medians of each side. Pure: reads the report's rows.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

Row = dict[str, Any]


def calls_per_cpu_s(row: Row) -> float | None:
    """1,000 / CPU ms per call of a point: the whole service's (only when the bench read every
    component, not the API alone) or a baseline's interpreters'."""
    cpu = row.get("cpu_ms_per_call") or {}
    if "interpreters" in cpu:
        ms = float(cpu["interpreters"])
    elif "workers" in cpu and "total" in cpu:
        ms = float(cpu["total"])
    else:
        return None
    return 1000.0 / ms if ms > 0 else None


def efficiency(rows: Sequence[Row]) -> list[Row]:
    """Per workload, calls per request and baseline: the service's calls per CPU-second against
    the baseline's, per alternating round and as medians; the sweep's points beside them."""
    out: list[Row] = []
    for workload, batch in dict.fromkeys(
        (r["workload"], r["batch"]) for r in rows if r["target"] == "service round"
    ):
        service_rounds = _rounds(rows, workload, "service round", batch=batch)
        sweep = [
            round(v, 1)
            for r in rows
            if (r["target"], r["workload"], r["batch"]) == ("service", workload, batch)
            and (v := calls_per_cpu_s(r)) is not None
        ]
        names = (
            r["baseline"]
            for r in rows
            if (r["target"], r["workload"]) == ("baseline round", workload)
        )
        for name in dict.fromkeys(names):
            baseline_rounds = _rounds(rows, workload, "baseline round", baseline=name)
            pairs = [
                (s, b)
                for s, b in zip(service_rounds, baseline_rounds, strict=False)
                if s is not None and b is not None
            ]
            if not pairs:
                continue
            out.append(
                {
                    "workload": workload,
                    "batch": batch,
                    "baseline": name,
                    "service_calls_per_cpu_s": round(statistics.median(s for s, _ in pairs), 1),
                    "baseline_calls_per_cpu_s": round(statistics.median(b for _, b in pairs), 1),
                    "round_ratios": [round(s / b, 2) for s, b in pairs],
                    "ratio_median": round(statistics.median(s / b for s, b in pairs), 2),
                    "service_sweep_calls_per_cpu_s": sweep,
                }
            )
    return out


def _rounds(
    rows: Sequence[Row], workload: str, target: str, batch: int = 1, baseline: str = ""
) -> list[float | None]:
    """Calls per CPU-second of each round of one kind, in order (None where not readable)."""
    return [
        calls_per_cpu_s(r)
        for r in rows
        if (r["target"], r["workload"], r.get("baseline", "")) == (target, workload, baseline)
        and (baseline or r["batch"] == batch)
    ]


def table(entries: Sequence[Row]) -> list[str]:
    """Markdown lines of the efficiency rows (none when there are none)."""
    if not entries:
        return []
    lines = [
        "",
        "| workload | calls per request | service calls/CPU-s (median of rounds) | baseline"
        " | baseline calls/CPU-s | service / baseline: median (rounds)"
        " | service sweep calls/CPU-s |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        rounds = ", ".join(f"{x}x" for x in e["round_ratios"])
        sweep = ", ".join(str(x) for x in e["service_sweep_calls_per_cpu_s"])
        lines.append(
            f"| {e['workload']} | {e['batch']} | **{e['service_calls_per_cpu_s']}** "
            f"| {e['baseline']} | {e['baseline_calls_per_cpu_s']} "
            f"| **{e['ratio_median']}x** ({rounds}) | {sweep} |"
        )
    return lines
