"""One answer-verifier worker process: `python -m rl.verify_worker`, driven by `rl.verifier`.

Protocol, one JSON object per line:
  worker -> parent, once, after the imports:  {"ready": true}
  parent -> worker:  {"prediction": str, "gold": str, "rel_tol": float, "soft_timeout_s": float}
  worker -> parent:  {"equal": bool, "status": "ok" | "timeout" | "error", "detail": str}

The soft time-out (an interval timer that raises between bytecodes) saves a restart when sympy
is slow in Python code; the parent's hard limit (SIGKILL) covers the cases it cannot stop.
EOF on stdin ends the worker.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import signal
import sys
from types import FrameType
from typing import Any, TextIO

_PR_SET_PDEATHSIG = 1


class _SoftTimeout(BaseException):
    """Raised by the interval timer; a BaseException so `except Exception` in sympy lets it by."""


_armed = False


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    if _armed:
        raise _SoftTimeout


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL us when the parent dies, so a hung check cannot outlive the trainer."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: EOF on stdin still ends an idle worker
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def _check(request: dict[str, Any]) -> dict[str, Any]:
    global _armed
    from rl.math_equal import is_equivalent

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


def _send(out: TextIO, message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def main(argv: list[str] | None = None) -> None:
    """Serve checks from stdin until EOF."""
    parser = argparse.ArgumentParser(prog="rl.verify_worker")
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--memory-mb", type=int, default=0, help="RLIMIT_AS; 0: none")
    args = parser.parse_args(argv)

    _die_with_parent(args.parent_pid)
    if args.memory_mb > 0:
        limit = args.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    # The protocol owns the real stdout; anything a library prints goes to stderr instead.
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop

    from rl.math_equal import is_equivalent

    is_equivalent("1", "1")  # load the LaTeX grammar now, not during the first timed check
    _send(protocol, {"ready": True})

    for line in sys.stdin:
        if line.strip():
            _send(protocol, _check(json.loads(line)))


if __name__ == "__main__":
    main()
