"""Latency of the E2B SDK's calls against a running rl-sandbox, from the client's side.

Run it with an interpreter that has the SDK (`pip install e2b-code-interpreter`), the service's
URL and key in E2B's variables (docs/compatibility.md, "E2B code interpreter"):

    E2B_API_URL=http://127.0.0.1:8000 E2B_SANDBOX_URL=http://127.0.0.1:8000 \\
    E2B_API_KEY=e2b_<hex of the key> python scripts/bench_e2b.py --rounds 30

Prints the median and 90th percentile in milliseconds of each call, on one sandbox.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from e2b_code_interpreter import Sandbox


def timed(call: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median and 90th percentile of `rounds` calls, in milliseconds (one warm-up first)."""
    call()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.9) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    rounds = parser.parse_args().rounds
    sandbox = Sandbox.create()
    contexts = []
    calls: dict[str, Callable[[], object]] = {
        "run_code('1')": lambda: sandbox.run_code("1"),
        "create_code_context()": lambda: contexts.append(sandbox.create_code_context()),
        "run_code('1'), sandbox with contexts": lambda: sandbox.run_code("1"),
        "run_code, alternating two contexts": lambda: (
            sandbox.run_code("1", context=contexts[0]),
            sandbox.run_code("1"),
        ),
        "commands.run('true')": lambda: sandbox.commands.run("true"),
        "commands.run('sleep 2')": lambda: sandbox.commands.run("sleep 2"),
        "files.write (1 KiB)": lambda: sandbox.files.write("/home/user/f.txt", "x" * 1024),
        "files.read (1 KiB)": lambda: sandbox.files.read("/home/user/f.txt"),
        "files.list('/home/user')": lambda: sandbox.files.list("/home/user"),
        "files.exists": lambda: sandbox.files.exists("/home/user/f.txt"),
    }
    try:
        for name, call in calls.items():
            times = rounds if "sleep" not in name and "create" not in name else 3
            median, p90 = timed(call, times)
            print(f"{name:40} median {median:8.1f} ms   p90 {p90:8.1f} ms   ({times} calls)")
    finally:
        sandbox.kill()


if __name__ == "__main__":
    main()
