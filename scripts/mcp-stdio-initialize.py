"""Seconds from starting `rl-sandbox mcp` on stdio to its answer to `initialize`.

    .venv/bin/python scripts/mcp-stdio-initialize.py [--runs 5] [--command 'rl-sandbox mcp']

No service is needed: `initialize` is answered by the stdio server itself. Prints each run's
seconds and the median; what it measures is what an MCP host waits before its first tool list
(the OpenAI Agents SDK gives up after 5 s by default).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import time

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "measure", "version": "0"},
    },
}


def one_run(command: list[str]) -> tuple[float, str]:
    """(seconds to the answer's line, what the server wrote to stderr)."""
    env = {**os.environ, "RL_SANDBOX_URL": "http://127.0.0.1:9"}
    started = time.perf_counter()
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write((json.dumps(INITIALIZE) + "\n").encode())
    proc.stdin.flush()
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - started
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    answer = json.loads(line)
    assert answer.get("id") == 1 and "result" in answer, answer
    return elapsed, proc.stderr.read().decode(errors="replace")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--command", default=".venv/bin/rl-sandbox mcp")
    args = parser.parse_args()
    times = []
    for _ in range(args.runs):
        elapsed, stderr = one_run(shlex.split(args.command))
        times.append(elapsed)
        noise = f"  (stderr: {len(stderr.splitlines())} lines)" if stderr else ""
        print(f"{elapsed:.3f} s{noise}")
    print(f"median {statistics.median(times):.3f} s over {len(times)} runs")


if __name__ == "__main__":
    main()
