"""Grading's cost per case over a plain `/execute` of the same program, on a running server.

    python scripts/grade_overhead.py --url http://127.0.0.1:8000 [--rounds 200]

One client, one call at a time, alternating: `/execute` of a program that defines `f` and
prints `f(20)`; `/grade` of the same definition as one `stdio` case, as one `function` case,
and as one `asserts` case. Prints the p50 and p90 of each call as the client saw it, and the
p50 of the run's own `wall_time` in the jail (a grade's case: its last candidate run), each
with its difference from /execute's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import httpx

DEFINITION = "def f(x):\n    return x * 2 + 1\n"
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "execute": ("/execute", {"code": DEFINITION + "print(f(20))\n"}),
    "grade stdio": (
        "/grade",
        {
            "code": DEFINITION + "print(f(int(input())))\n",
            "tests": {"kind": "stdio", "cases": [{"stdin": "20", "expected_stdout": "41"}]},
        },
    ),
    "grade function": (
        "/grade",
        {
            "code": DEFINITION,
            "tests": {
                "kind": "function",
                "entry_point": "f",
                "cases": [{"args": [20], "expected": 41}],
            },
        },
    ),
    "grade asserts": (
        "/grade",
        {"code": DEFINITION, "tests": {"kind": "asserts", "asserts": ["assert f(20) == 41"]}},
    ),
}


def main() -> None:
    """Time each call shape; print percentiles and the overhead over /execute."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--rounds", type=int, default=200)
    options = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in CALLS}
    walls: dict[str, list[float]] = {name: [] for name in CALLS}
    with httpx.Client(base_url=options.url, timeout=60) as client:
        for round_index in range(options.rounds + 10):
            for name, (path, body) in CALLS.items():
                started = time.perf_counter()
                reply = client.post(path, json=body)
                elapsed = time.perf_counter() - started
                reply.raise_for_status()
                answer = reply.json()
                assert answer.get("status") in ("ok", "graded") and answer.get("reward", 1) == 1
                if round_index >= 10:  # the first rounds warm the workers up
                    times[name].append(elapsed * 1000)
                    wall = (
                        answer["cases"][0]["wall_time"]
                        if "cases" in answer
                        else answer["wall_time"]
                    )
                    walls[name].append(wall * 1000)
    base = statistics.median(times["execute"])
    base_wall = statistics.median(walls["execute"])
    print("call            client p50   p90       over execute | run's wall_time p50, over execute")
    for name, samples in times.items():
        p50 = statistics.median(samples)
        p90 = statistics.quantiles(samples, n=10)[-1]
        wall = statistics.median(walls[name])
        print(
            f"{name:15s} {p50:6.1f} ms {p90:6.1f} ms  {p50 - base:+6.1f} ms"
            f"   | {wall:6.2f} ms  {wall - base_wall:+6.2f} ms"
        )


if __name__ == "__main__":
    main()
