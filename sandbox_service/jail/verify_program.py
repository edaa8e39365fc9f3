"""The program `POST /verify` runs inside the jail: it judges a batch of (answer, reference) items.

Sent as an ordinary execution's `code` (this file's source, then a call of `main` with the
checker module's source, `rl/reward/math_equal.py`), with the items as JSON on stdin:

    stdin   {"items": [[answer, reference], ...], "timeout_s": float, "rel_tol": float,
             "soft": bool (default true; false leaves the SIGKILL as the only limit, for tests)}
    stdout  one line per item, in the order they finish:
            {"i": index, "v": verdict, "r": reason, "t": seconds, "d": detail}

The checker is imported once; each item is then judged in a child forked from this process,
which is SIGKILLed when it overruns `timeout_s`: sympy can hang in C code that no signal
interrupts (a big-integer power such as 9^(9^(9^9))), and a child that math-verify's `eval` has
been made to run something owns only its own verdict. The jail's own time limit, the job's, is
the backstop for this process. Standard library only, and it must not import sandbox_service:
it runs in the jail's interpreter, which sees the service's libraries but not its packages.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import types
from typing import Any

SOFT_FRACTION = 0.8
"""The child's own timer fires at this share of the limit, so a check that is slow in Python
code ends with a verdict from the child; the SIGKILL at the limit covers the rest."""
DETAIL_CHARS = 160
"""Longest detail string written (the API bounds what it reads anyway)."""


class _SoftTimeout(BaseException):
    """From the child's interval timer; a BaseException: `except Exception` in sympy lets it by."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _SoftTimeout


_VERDICTS = {
    "equal": ("correct", "equivalent"),
    "not_equal": ("incorrect", "not_equivalent"),
    "unparsable_answer": ("invalid", "unparsable_answer"),
    "unparsable_reference": ("invalid", "unparsable_reference"),
}


def _judge(
    checker: Any, answer: str, reference: str, rel_tol: float, soft_s: float
) -> dict[str, str]:
    signal.signal(signal.SIGALRM, _on_alarm)
    if soft_s > 0:
        signal.setitimer(signal.ITIMER_REAL, soft_s)
    try:
        verdict, reason = _VERDICTS[checker.compare(answer, reference, rel_tol=rel_tol)]
        return {"v": verdict, "r": reason, "d": ""}
    except _SoftTimeout:
        return {"v": "timeout", "r": "time_limit", "d": "stopped by the check's own timer"}
    except (Exception, RecursionError, MemoryError) as exc:
        return {"v": "invalid", "r": "checker_error", "d": f"{type(exc).__name__}: {exc}"}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _child(
    checker: Any, write_fd: int, answer: str, reference: str, rel_tol: float, soft_s: float
) -> None:
    try:
        reply = _judge(checker, answer, reference, rel_tol, soft_s)
        os.write(write_fd, json.dumps(reply).encode()[:4096])
    finally:
        os._exit(0)


def _one(
    checker: Any,
    index: int,
    answer: str,
    reference: str,
    timeout_s: float,
    rel_tol: float,
    soft: bool,
) -> dict[str, Any]:
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(
            checker, write_fd, answer, reference, rel_tol, timeout_s * SOFT_FRACTION if soft else 0
        )
    os.close(write_fd)
    deadline = started + timeout_s
    data = b""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                break
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_fd)
    timed_out = time.monotonic() >= deadline and not data
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    reply: dict[str, Any]
    try:
        reply = json.loads(data) if data else {}
    except ValueError:
        reply = {}
    if timed_out:
        reply = {"v": "timeout", "r": "time_limit", "d": f"killed after {timeout_s:g} s"}
    elif "v" not in reply:
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "no verdict"
        reply = {"v": "invalid", "r": "crashed", "d": f"the check died ({how})"}
    reply["d"] = str(reply.get("d", ""))[:DETAIL_CHARS]
    return {"i": index, **reply, "t": round(time.monotonic() - started, 4)}


def load_checker(source: str) -> types.ModuleType:
    """The checker module made from its source (it imports sympy and math-verify)."""
    module = types.ModuleType("rl_sandbox_answer_checker")
    sys.modules[module.__name__] = module
    exec(compile(source, "answer_checker.py", "exec"), module.__dict__)
    return module


def main(checker_source: str) -> None:
    """Judge the items on stdin, one verdict line each on stdout."""
    request = json.loads(sys.stdin.read())
    timeout_s = float(request["timeout_s"])
    rel_tol = float(request["rel_tol"])
    soft = bool(request.get("soft", True))
    checker = load_checker(checker_source)
    checker.compare("1", "1")  # load the LaTeX grammar once, not in every child
    for index, (answer, reference) in enumerate(request["items"]):
        line = _one(checker, index, str(answer), str(reference), timeout_s, rel_tol, soft)
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()  # a jail killed later keeps the verdicts already written
