"""Turn a raw process outcome into an API status: a pure function over a rule table.

A jail that fails (no zygote answer, a setup failure) never reaches here: the executor replaces it
and retries, then answers sandbox_error itself (jail/executor.py).

The rules, first match wins:

| condition                                                         | status        |
|-------------------------------------------------------------------|---------------|
| the wall-clock limit was reached                                  | timeout       |
| the run cgroup's OOM killer struck, and the exit was not 0        | memory_limit  |
| ended by SIGXCPU with its CPU time at the CPU-time limit          | timeout       |
| ended by a signal (a SIGXCPU the program sent itself included)    | killed        |
| exit code 0                                                       | ok            |
| non-zero exit, ended by an uncaught MemoryError the runner caught | memory_limit  |
| non-zero exit, last stderr line a MemoryError, peak at the limit  | memory_limit  |
| non-zero exit, last stderr line an OSError ENOMEM, peak at limit  | memory_limit  |
| non-zero exit                                                     | error         |

Only what the kernel and the limits say decides a status: the wait status, the CPU time (its
rusage), the cgroup's OOM-kill counter and peak. What the program writes (its stderr, its
rich outputs) never does alone: a MemoryError printed to stderr far below the limit is the
program's `error`. An uncaught MemoryError that ended the program (API.md: "MemoryError that
ended the program", as when numpy cannot allocate an array larger than the memory the kernel
grants) is `memory_limit` wherever its peak stood: the runner in the program's process records
it, so a program can claim it for itself, but it can only move its own failure between two of
its own statuses (`error`, `memory_limit`), never to `ok` or to an infrastructure status.

A write into the run's tmpfs at the limit can fail with ENOMEM without the OOM killer striking
(the kernel refuses the page's charge in the system call): the program then ends on
`OSError: [Errno 12] Cannot allocate memory` with its peak at the limit, which is the memory
limit too.
"""

from __future__ import annotations

import errno
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
    cpu_limit_reached: bool = False
    """The program's process had used its CPU-time limit (the kernel's count, inside/process.py)."""
    peak_memory_mb: float | None = None
    """The run cgroup's peak, from the kernel (None where it cannot be read)."""
    memory_limit_mb: float | None = None
    raised_memory_error: bool = False
    """The program ended on an uncaught MemoryError (the runner's record of its exception)."""


MEMORY_AT_LIMIT_SLACK_MB = 1.0


def _memory_at_limit(raw: RawOutcome) -> bool:
    return (
        raw.peak_memory_mb is not None
        and raw.memory_limit_mb is not None
        and raw.peak_memory_mb >= raw.memory_limit_mb - MEMORY_AT_LIMIT_SLACK_MB
    )


_REFUSED_MEMORY = f"OSError: [Errno {errno.ENOMEM}]"


def _died_of_memory_error(stderr_tail: str) -> bool:
    lines = [line for line in stderr_tail.strip().splitlines() if line.strip()]
    return bool(lines) and lines[-1].startswith(("MemoryError", _REFUSED_MEMORY))


def classify(raw: RawOutcome) -> Status:
    """The status of one execution (see the table at the top of this module)."""
    if raw.timed_out:
        return Status.TIMEOUT
    if raw.oom_killed and raw.exit_code != 0:
        return Status.MEMORY_LIMIT
    if raw.signal == signal.SIGXCPU and raw.cpu_limit_reached:
        return Status.TIMEOUT
    if raw.signal is not None:
        return Status.KILLED
    if raw.exit_code == 0:
        return Status.OK
    if raw.raised_memory_error:
        return Status.MEMORY_LIMIT
    if _died_of_memory_error(raw.stderr_tail) and _memory_at_limit(raw):
        return Status.MEMORY_LIMIT
    return Status.ERROR
