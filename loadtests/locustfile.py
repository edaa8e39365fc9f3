"""Locust load test of rl-sandbox: RL tool-call traffic, every result checked by its status.

Users are policies in a rollout: they think a little (generate), then send a tool call drawn from
mix.py (prints, arithmetic, sympy, numpy, stdin, errors, time-outs, hostile programs), or now and
then a batch of eight. A call counts as a failure unless its HTTP code is 200 *and* its status
(and, for `ok`, its stdout) is what that program must get; statistics are grouped by kind
(`/execute [sympy]`, ...). `SessionUser` (one in five users) plays multi-turn episodes:
notebook-style cells in a session, then DELETE (`make loadtest LOADTEST_SESSIONS=` leaves it out).

    make loadtest                       # headless, bounded, against a private local service
    locust -f loadtests/locustfile.py --host http://127.0.0.1:8000   # web UI, your service
"""

from __future__ import annotations

import json
import random
import sys
import uuid
from pathlib import Path
from typing import Any

from locust import FastHttpUser, between, task

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mix import Program, pick  # type: ignore[import-not-found,unused-ignore]

BATCH_SIZE = 8


def _check_response(response: Any, programs: list[Program]) -> None:
    """Mark a catch_response context failed unless every result is right."""
    if response.status_code != 200:
        response.failure(f"HTTP {response.status_code}: {str(response.text)[:200]}")
        return
    try:
        body = json.loads(response.text)
    except (TypeError, ValueError):
        response.failure(f"not JSON: {str(response.text)[:200]}")
        return
    results = body.get("results", [body])
    if len(results) != len(programs):
        response.failure(f"{len(results)} results for {len(programs)} requests")
        return
    problems = [p for p in (prog.check(r) for prog, r in zip(programs, results, strict=True)) if p]
    if problems:
        response.failure("; ".join(problems)[:500])
    else:
        response.success()


class ToolCallUser(FastHttpUser):
    """A policy sending single tool calls (10 in 11) and batches of eight (1 in 11)."""

    weight = 4

    wait_time = between(0.05, 0.5)
    """The model generating its next call."""

    def on_start(self) -> None:
        self.rng = random.Random()

    @task(10)
    def single(self) -> None:
        program = pick(self.rng)
        with self.client.post(
            "/execute", json=program.request(), name=f"/execute [{program.kind}]",
            catch_response=True,
        ) as response:  # fmt: skip
            _check_response(response, [program])

    @task(1)
    def batch(self) -> None:
        programs = [pick(self.rng) for _ in range(BATCH_SIZE)]
        body = {"requests": [p.request() for p in programs]}
        with self.client.post(
            "/execute/batch", json=body, name=f"/execute/batch [{BATCH_SIZE}]",
            catch_response=True,
        ) as response:  # fmt: skip
            _check_response(response, programs)


class SessionUser(FastHttpUser):
    """A policy in a multi-turn episode: cells of one session that build on each other."""

    weight = 1

    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        self.rng = random.Random()

    @task
    def episode(self) -> None:
        session_id = f"lt-{uuid.uuid4().hex}"
        a, b = self.rng.randrange(100), self.rng.randrange(1, 100)
        cells = [
            (f"import sympy as sp\nx = sp.symbols('x')\na, b = {a}, {b}", None),
            ("roots = sp.solve((x - a) * (x - b), x)\nlen(roots)", f"{1 if a == b else 2}\n"),
            ("print(sorted(roots))", f"{sorted({a, b})}\n"),
            ("a * b", f"{a * b}\n"),
        ]
        for i, (code, stdout) in enumerate(cells):
            program = Program("session", f"cell {i}", code, frozenset({"ok"}), stdout or "")
            with self.client.post(
                "/execute", json={"code": code, "session_id": session_id},
                name="/execute [session cell]", catch_response=True,
            ) as response:  # fmt: skip
                _check_response(response, [program])
                if response.status_code != 200:
                    return
        with self.client.delete(
            f"/sessions/{session_id}", name="/sessions/{id} [DELETE]", catch_response=True
        ) as response:
            if response.status_code in (200, 204):
                response.success()
            else:
                response.failure(f"HTTP {response.status_code}: {str(response.text)[:200]}")
