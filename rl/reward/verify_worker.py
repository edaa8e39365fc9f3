"""The body of one answer-verifier worker process, started by `rl.reward.verifier.VerifierPool`.

Protocol over a multiprocessing Connection (pickled dicts):
  worker -> parent, once, when it can take checks:  {"ready": True}
  parent -> worker:  {"prediction": str, "gold": str, "rel_tol": float, "soft_timeout_s": float}
  worker -> parent:  {"equal": bool, "status": "ok" | "timeout" | "error", "detail": str}

The soft time-out (an interval timer that raises between bytecodes) saves a restart when sympy
is slow in Python code; the parent's hard limit (SIGKILL) covers what it cannot stop, such as a
big-integer power in C. EOF on the connection ends the worker.
"""

from __future__ import annotations

import os
import resource
import signal
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any


class _SoftTimeout(BaseException):
    """Raised by the interval timer; a BaseException so `except Exception` in sympy lets it by."""


_armed = False


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    if _armed:
        raise _SoftTimeout


def _check(request: dict[str, Any]) -> dict[str, Any]:
    global _armed
    from rl.reward.math_equal import is_equivalent

    soft_timeout_s = float(request.get("soft_timeout_s", 0.0))
    try:
        if soft_timeout_s > 0:
            _armed = True
            signal.setitimer(signal.ITIMER_REAL, soft_timeout_s)
        equal = is_equivalent(
            str(request["prediction"]), str(request["gold"]), rel_tol=float(request["rel_tol"])
        )
        return {"equal": bool(equal), "status": "ok", "detail": ""}
    except _SoftTimeout:
        return {"equal": False, "status": "timeout", "detail": "soft time-out"}
    except (Exception, RecursionError, MemoryError) as exc:
        return {"equal": False, "status": "error", "detail": f"{type(exc).__name__}: {exc}"[:200]}
    finally:
        _armed = False
        signal.setitimer(signal.ITIMER_REAL, 0)


def serve(conn: Connection, memory_mb: int | None) -> None:
    """Answer checks on conn until EOF (the process target of every worker)."""
    # Only here, in the pool's process: importing the checker must not load the service.
    from sandbox_service.local.procs import die_with_parent

    die_with_parent(os.getppid())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's; the pool stops us
    signal.signal(signal.SIGALRM, _on_alarm)
    if memory_mb:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    from rl.reward.math_equal import is_equivalent  # preloaded by the fork server: no cost there

    is_equivalent("1", "1")  # load the LaTeX grammar now, not during the first timed check
    conn.send({"ready": True})
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(_check(request))
