"""Jailed execution: nsjail + seccomp + cgroups around a forking Python zygote."""

from __future__ import annotations

from sandbox_service.executor import Executor
from sandbox_service.jail.executor import JailExecutor
from sandbox_service.settings import ExecutorMode, Settings


def create_executor(settings: Settings, slot: int, mode: ExecutorMode | None = None) -> Executor:
    """The executor of one worker slot, in settings.executor_mode unless `mode` is given."""
    return JailExecutor(settings, slot, mode)


__all__ = ["JailExecutor", "create_executor"]
