"""Turn a raw process outcome into an API status: a pure function over a rule table.

A jail that fails (no zygote answer, a setup failure) never reaches here: the executor replaces it
and retries, then answers sandbox_error itself (jail/executor.py).

The rules, first match wins:

| condition                                                | status          |
|----------------------------------------------------------|-----------------|
| the wall-clock limit was reached                         | timeout         |
| the cgroup's OOM killer struck, and the exit was not 0   | memory_limit    |
| ended by SIGXCPU (the CPU-time limit)                    | timeout         |
| ended by another signal                                  | killed          |
| exit code 0                                              | ok              |
| non-zero exit, last stderr line is a MemoryError         | memory_limit    |
| non-zero exit                                            | error           |
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from sandbox_service.execution import Status


@dataclass(frozen=True, slots=True)
class RawOutcome:
    """What the zygote and the cgroups observed about one execution."""

    exit_code: int | None
    signal: int | None
    timed_out: bool
    oom_killed: bool
    stderr_tail: str = ""


def _died_of_memory_error(stderr_tail: str) -> bool:
    lines = [line for line in stderr_tail.strip().splitlines() if line.strip()]
    return bool(lines) and lines[-1].startswith("MemoryError")


def classify(raw: RawOutcome) -> Status:
    """The status of one execution (see the table at the top of this module)."""
    if raw.timed_out:
        return Status.TIMEOUT
    if raw.oom_killed and raw.exit_code != 0:
        return Status.MEMORY_LIMIT
    if raw.signal == signal.SIGXCPU:
        return Status.TIMEOUT
    if raw.signal is not None:
        return Status.KILLED
    if raw.exit_code == 0:
        return Status.OK
    if _died_of_memory_error(raw.stderr_tail):
        return Status.MEMORY_LIMIT
    return Status.ERROR
