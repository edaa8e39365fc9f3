"""The benchmark's output: progress bar, ratios against the baseline, Markdown table, PNG plot."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any, Protocol

from sandbox_service.bench.efficiency import table as efficiency_table

Row = dict[str, Any]


class Counted(Protocol):
    """What the progress bar reads of the point in progress."""

    latencies_s: list[float]
    failed: int


class Progress:
    """A one-line progress bar on stderr: points done, the point running, its calls so far."""

    def __init__(self, total: int, enabled: bool = True, width: int = 24) -> None:
        self._total = max(total, 1)
        self._done = 0
        self._enabled = enabled
        self._width = width
        self._tty = sys.stderr.isatty()
        self._started = time.monotonic()

    async def track(self, label: str, point: Counted, work: Awaitable[None]) -> None:
        """Run one point's work, redrawing the bar while it runs."""
        ticker = asyncio.create_task(self._tick(label, point)) if self._enabled else None
        try:
            await work
        finally:
            if ticker is not None:
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
            self._done += 1
            self._draw(label, point)

    async def _tick(self, label: str, point: Counted) -> None:
        # On a terminal the line is redrawn in place; in a log, one line every 10 s.
        while True:
            if self._tty:
                self._draw(label, point)
            await asyncio.sleep(0.25 if self._tty else 10.0)
            if not self._tty:
                self._draw(label, point)

    def _draw(self, label: str, point: Counted) -> None:
        if not self._enabled:
            return
        filled = self._width * self._done // self._total
        bar = "#" * filled + "." * (self._width - filled)
        calls = len(point.latencies_s)
        failed = f", {point.failed} FAILED" if point.failed else ""
        line = (
            f"[{bar}] {self._done}/{self._total} {time.monotonic() - self._started:5.0f}s "
            f"{label}: {calls} calls{failed}"
        )
        if self._tty:
            sys.stderr.write("\r\x1b[2K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        """End the bar's line."""
        if self._enabled and self._tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _best(rows: Sequence[Row], target: str, workload: str, baseline: str = "") -> Row | None:
    mine = [
        r
        for r in rows
        if (r["target"], r["workload"], r.get("baseline", "")) == (target, workload, baseline)
    ]
    return max(mine, key=lambda r: r["calls_per_s"], default=None)


def _at(
    rows: Sequence[Row], target: str, workload: str, concurrency: int, baseline: str = ""
) -> Row | None:
    for r in rows:
        key = (r["target"], r["workload"], r["concurrency"], r.get("baseline", ""))
        if key == (target, workload, concurrency, baseline):
            return r
    return None


def ratios(rows: Sequence[Row]) -> list[Row]:
    """Per workload and baseline, service against that baseline, all measured in the same run:

    - `throughput_ratio`: best service throughput of the sweep over the best baseline;
    - `interleaved_ratio_median`: the median over alternating rounds (service at its best
      concurrency, then the baseline), robust to a machine whose load drifts during the run;
    - `cpu_ratio`: CPU per call of the baseline over that of the service (all its processes and
      the load generator), which other load on the machine barely moves;
    - `p50_speedup_c1`: the p50 of one call at concurrency 1, baseline over service.
    """
    out: list[Row] = []
    pairs_seen = dict.fromkeys(
        (r["workload"], r.get("baseline", "")) for r in rows if r["target"] == "baseline"
    )
    for workload, name in pairs_seen:
        service, baseline = (
            _best(rows, "service", workload),
            _best(rows, "baseline", workload, name),
        )
        if service is None or baseline is None or not baseline["calls_per_s"]:
            continue
        entry: Row = {
            "workload": workload,
            "baseline": name,
            "service_best_calls_per_s": service["calls_per_s"],
            "service_best_at_concurrency": service["concurrency"],
            "baseline_best_calls_per_s": baseline["calls_per_s"],
            "throughput_ratio": round(service["calls_per_s"] / baseline["calls_per_s"], 2),
        }
        service_rounds = [
            r
            for r in rows
            if (r["target"], r["workload"]) == ("service round", workload)
            and r["batch"] == service["batch"]
        ]
        baseline_rounds = [
            r
            for r in rows
            if (r["target"], r["workload"], r.get("baseline", ""))
            == ("baseline round", workload, name)
        ]
        per_round = [
            s["calls_per_s"] / b["calls_per_s"]
            for s, b in zip(service_rounds, baseline_rounds, strict=True)
            if b["calls_per_s"]
        ]
        if per_round:
            entry["interleaved_ratios"] = [round(x, 2) for x in per_round]
            entry["interleaved_ratio_median"] = round(statistics.median(per_round), 2)
        s_cpu, b_cpu = _cpu_per_call(service), _cpu_per_call(baseline)
        if s_cpu and b_cpu:
            entry["service_cpu_ms_per_call"] = round(s_cpu, 2)
            entry["baseline_cpu_ms_per_call"] = round(b_cpu, 2)
            entry["cpu_ratio"] = round(b_cpu / s_cpu, 2)
        s1, b1 = _at(rows, "service", workload, 1), _at(rows, "baseline", workload, 1, name)
        if s1 is not None and b1 is not None and s1["p50_ms"]:
            entry["service_p50_ms_c1"] = s1["p50_ms"]
            entry["baseline_p50_ms_c1"] = b1["p50_ms"]
            entry["p50_speedup_c1"] = round(b1["p50_ms"] / s1["p50_ms"], 2)
        out.append(entry)
    return out


SERVICE_PATH = ("api", "workers", "redis")
"""The components of the service's own path: everything a call costs but its jail's run."""


def batching(rows: Sequence[Row]) -> list[Row]:
    """For each service point measured single and batched (BenchOptions.compare_batch): the
    service path's CPU per call in both and the batched one's share of the single one; with
    alternating rounds (BenchOptions.batch_rounds), each round's share and their median.

    `merged`: a jail ended during one of the points, so its CPU counts with the workers there
    (procs.py) and the service path reads high; such a round is left out of the median."""
    out: list[Row] = []
    service = [r for r in rows if r["target"] == "service"]
    for single in (r for r in service if r["batch"] == 1):
        for batched in service:
            same = (batched["workload"], batched["concurrency"])
            if batched["batch"] == 1 or same != (single["workload"], single["concurrency"]):
                continue
            share = _share(single, batched)
            if share is None:
                continue
            single_ms, batched_ms = share
            entry: Row = {
                "workload": single["workload"],
                "concurrency": single["concurrency"],
                "batch": batched["batch"],
                "single_ms": round(single_ms, 3),
                "batched_ms": round(batched_ms, 3),
                "batched_share": round(batched_ms / single_ms, 3),
                "single_parts": {k: single["cpu_ms_per_call"].get(k) for k in SERVICE_PATH},
                "batched_parts": {k: batched["cpu_ms_per_call"].get(k) for k in SERVICE_PATH},
                "merged": _merged(single, batched),
            }
            rounds = _round_shares(
                rows, single["workload"], single["concurrency"], batched["batch"]
            )
            if rounds:
                entry["round_shares"] = rounds
                entry["round_share_median"] = round(statistics.median(rounds), 3)
            out.append(entry)
    return out


def _round_shares(rows: Sequence[Row], workload: str, concurrency: int, batch: int) -> list[float]:
    """The batched share of each alternating round (single, then batched) without a merge."""
    mine = [
        r
        for r in rows
        if (r["target"], r["workload"], r["concurrency"]) == ("batch round", workload, concurrency)
    ]
    singles = [r for r in mine if r["batch"] == 1]
    batched = [r for r in mine if r["batch"] == batch]
    shares = []
    for one, many in zip(singles, batched, strict=False):
        share = _share(one, many)
        if share is not None and not _merged(one, many):
            shares.append(round(share[1] / share[0], 3))
    return shares


def _share(single: Row, batched: Row) -> tuple[float, float] | None:
    paths = [_service_path_ms(r) for r in (single, batched)]
    if paths[0] is None or paths[1] is None or not paths[0]:
        return None
    return float(paths[0]), float(paths[1])


def _merged(*rows: Row) -> bool:
    return any("jail" not in r["cpu_ms_per_call"] for r in rows)


def _service_path_ms(row: Row) -> float | None:
    cpu = row.get("cpu_ms_per_call") or {}
    if not all(k in cpu for k in SERVICE_PATH):
        return None
    return sum(float(cpu[k]) for k in SERVICE_PATH)


def _cpu_per_call(row: Row) -> float | None:
    cpu = row.get("cpu_ms_per_call") or {}
    if "total" not in cpu:
        return None
    return float(cpu["total"]) + float(cpu.get("bench", 0.0))


def table(report: Row) -> str:
    """The report as Markdown: one row per point, then the ratios."""
    cols = ["target", "baseline", "workload", "concurrency", "batch", "calls", "failed"]
    cols += ["calls_per_s"]
    cols += ["p50_ms", "p99_ms", "load_avg_1m"]
    lines = [
        f"cores {report['cores']}, load average before {report['load_avg_before']}, "
        f"after {report['load_avg_after']}",
        "",
        "| "
        + " | ".join(cols)
        + " | CPU ms/call (api, workers, jail, redis) | API RSS MiB (start/max/end) |",
        "|" + "---|" * (len(cols) + 2),
    ]
    for r in report["points"]:
        cpu = r.get("cpu_ms_per_call") or {}
        parts = ("api", "workers", "jail", "redis")
        cpu_text = "/".join(f"{cpu[k]:.2f}" if k in cpu else "-" for k in parts) if cpu else ""
        if "interpreters" in cpu:  # a baseline point
            cpu_text = f"interpreters {cpu['interpreters']:.2f}"
        rss = (r.get("rss_mb") or {}).get("api")
        rss_text = f"{rss['start']:.0f}/{rss['max']:.0f}/{rss['end']:.0f}" if rss else ""
        cells = [str(r.get(c, "")) for c in cols] + [cpu_text, rss_text]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "| workload | baseline | service best/s | baseline best/s | throughput ratio (sweep)"
        " | interleaved rounds | CPU ms/call service / baseline (ratio)"
        " | p50 c=1 service ms | p50 c=1 baseline ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for q in report["ratios"]:
        rounds = ", ".join(f"{x}x" for x in q.get("interleaved_ratios", []))
        median = q.get("interleaved_ratio_median")
        rounds_text = f"median {median}x ({rounds})" if median is not None else ""
        cpu_text = (
            f"{q['service_cpu_ms_per_call']} / {q['baseline_cpu_ms_per_call']} ({q['cpu_ratio']}x)"
            if "cpu_ratio" in q
            else ""
        )
        lines.append(
            f"| {q['workload']} | {q['baseline']} | {q['service_best_calls_per_s']} "
            f"(c={q['service_best_at_concurrency']}) | {q['baseline_best_calls_per_s']} | "
            f"{q['throughput_ratio']}x | {rounds_text} | {cpu_text} | "
            f"{q.get('service_p50_ms_c1', '')} | {q.get('baseline_p50_ms_c1', '')} |"
        )
    if report.get("batching"):
        lines += [
            "",
            "| workload | concurrency | batch | service path CPU ms/call single (api/workers/redis)"
            " | batched (api/workers/redis) | batched / single | alternating rounds |",
            "|---|---|---|---|---|---|---|",
        ]
        for b in report["batching"]:
            single, batched = (
                "/".join(f"{b[side][k]:.2f}" for k in SERVICE_PATH)
                for side in ("single_parts", "batched_parts")
            )
            merged = " (a jail ended: workers include it)" if b["merged"] else ""
            rounds = ", ".join(str(x) for x in b.get("round_shares", []))
            median = b.get("round_share_median")
            rounds_text = f"median {median} ({rounds})" if median is not None else ""
            lines.append(
                f"| {b['workload']} | {b['concurrency']} | {b['batch']} | {b['single_ms']} "
                f"({single}) | {b['batched_ms']} ({batched}) | {b['batched_share']}{merged} "
                f"| {rounds_text} |"
            )
    lines += efficiency_table(report.get("efficiency") or [])
    failures = [r for r in report["points"] if r["failed"]]
    for r in failures:
        lines.append(
            f"\nFAILED: {r['target']} {r['workload']} c={r['concurrency']}: {r['failed']} calls;"
            f" first: {r['first_failure']}"
        )
    return "\n".join(lines)


def plot(report: Row, path: Path) -> bool:
    """Throughput and p50/p99 against concurrency, one row per workload; False without
    matplotlib (the `dev` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows: list[Row] = report["points"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(len(workloads), 2, figsize=(10, 3.2 * len(workloads)), squeeze=False)
    for (ax_tp, ax_lat), workload in zip(axes, workloads, strict=True):
        service = sorted(
            (r for r in rows if r["target"] == "service" and r["workload"] == workload),
            key=lambda r: r["concurrency"],
        )
        conc = [r["concurrency"] for r in service]
        ax_tp.plot(conc, [r["calls_per_s"] for r in service], "o-", label="service")
        names = dict.fromkeys(
            r["baseline"] for r in rows if (r["target"], r["workload"]) == ("baseline", workload)
        )
        styles = dict(zip(names, ("--", ":", "-."), strict=False))
        for name, ls in styles.items():
            base = _best(rows, "baseline", workload, name)
            if base is not None:
                ax_tp.axhline(base["calls_per_s"], color="gray", ls=ls,
                              label=f"{name} (best, c={base['concurrency']})")  # fmt: skip
        ax_tp.set_title(f"{workload}: throughput")
        ax_tp.set_ylabel("calls/s")
        ax_lat.plot(conc, [r["p50_ms"] for r in service], "o-", label="service p50")
        ax_lat.plot(conc, [r["p99_ms"] for r in service], "s--", label="service p99")
        for name, ls in styles.items():
            base1 = _at(rows, "baseline", workload, 1, name)
            if base1 is not None:
                ax_lat.axhline(base1["p50_ms"], color="gray", ls=ls, label=f"{name} p50, c=1")
        ax_lat.set_yscale("log")
        ax_lat.set_title(f"{workload}: latency")
        ax_lat.set_ylabel("ms")
        for ax in (ax_tp, ax_lat):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency (callers in flight)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(
        f"rl-sandbox bench, {report['cores']} cores, load average before/after "
        f"{report['load_avg_before'][0]}/{report['load_avg_after'][0]}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True
