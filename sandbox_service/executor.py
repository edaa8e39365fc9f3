"""The executor interface: run one ExecutionSpec in a jail and return its ExecutionResult.

`create_executor(settings, slot)` builds the executor of one worker slot in the configured mode.
A program's failure is a result status; an exception means the executor itself failed.
"""

from __future__ import annotations

from typing import Protocol

from sandbox_service.execution import ExecutionResult, ExecutionSpec


class Executor(Protocol):
    """One executor slot: runs one execution at a time."""

    def run(self, spec: ExecutionSpec) -> ExecutionResult:
        """Run the program to completion (or to its limits) and report what happened."""
        ...

    def close(self) -> None:
        """Tear the jail down; no process of it survives."""
        ...
