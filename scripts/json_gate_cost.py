"""CPU the API's one parse of every body (api/json_gate.py) costs, for three typical bodies:
a small `/execute`, a batch of 256 calls, and one carrying 16 MiB of base64 files. Prints the
best of three rounds per body (process CPU time, so a busy machine slows the rounds but not the
measure).

    .venv/bin/python scripts/json_gate_cost.py

Needs no Redis, no worker and no root.
"""

from __future__ import annotations

import base64
import json
import os
import time

from sandbox_service.api.json_gate import body_problems

FILE = base64.b64encode(os.urandom(12 << 20)).decode()
BODIES = {
    "a small /execute": (json.dumps({"code": "print(1)", "timeout": 5}).encode(), 20_000),
    "a batch of 256 calls": (
        json.dumps({"requests": [{"code": "import sympy\nprint(sympy.sqrt(8))"}] * 256}).encode(),
        200,
    ),
    "16 MiB of files": (
        json.dumps(
            {
                "code": "print(1)",
                "files": {"in.bin": base64.b64encode(os.urandom(12 << 20)).decode()},
            }
        ).encode(),
        10,
    ),
}


def main() -> None:
    for name, (body, repeats) in BODIES.items():
        best = float("inf")
        for _ in range(3):
            started = time.process_time()
            for _ in range(repeats):
                assert body_problems(body) == []
            best = min(best, (time.process_time() - started) / repeats)
        print(f"{name} ({len(body)} bytes): {best * 1e6:.1f} us of CPU")


if __name__ == "__main__":
    main()
