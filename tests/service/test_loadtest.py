"""The load test's tool-call mix gets the results it expects from the real service, and Locust
runs the locustfile headless against it (a few seconds; load numbers are `make loadtest`'s job)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from loadtests.mix import HOSTILE, every_kind, pick
from tests.service.stack import Stack

ROOT = Path(__file__).resolve().parents[2]


async def test_every_program_of_the_mix_gets_its_expected_result(
    client: httpx.AsyncClient,
) -> None:
    programs = every_kind(random.Random(8)) + [pick(random.Random(i)) for i in range(6)]
    kinds = {p.kind for p in programs}
    assert kinds >= {"print", "sympy", "numpy", "error", "timeout", "hostile", "stdin"}
    assert set(HOSTILE) <= set(programs)

    async def run(body: dict[str, object]) -> httpx.Response:
        return await client.post("/execute", json=body)

    responses = await asyncio.gather(*(run(p.request()) for p in programs))
    assert [r.status_code for r in responses] == [200] * len(programs)
    problems = [p.check(r.json()) for p, r in zip(programs, responses, strict=True)]
    assert [p for p in problems if p] == []


@pytest.mark.slow
def test_locust_runs_the_locustfile_headless_with_no_failed_check(
    stack: Stack, tmp_path: Path
) -> None:
    argv = [
        sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests" / "locustfile.py"),
        "ToolCallUser", "SessionUser", "--headless", "--host", stack.url, "--users", "5",
        "--spawn-rate", "5", "--run-time", "4s", "--stop-timeout", "20",
        "--csv", str(tmp_path / "locust"), "--only-summary", "--loglevel", "WARNING",
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    stats = (tmp_path / "locust_stats.csv").read_text().splitlines()
    aggregated = next(line for line in stats if ",Aggregated," in line).split(",")
    assert int(aggregated[2]) > 0 and int(aggregated[3]) == 0  # requests, failures
