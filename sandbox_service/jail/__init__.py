"""Jailed execution: nsjail + seccomp + cgroups around a forking Python zygote."""

from __future__ import annotations

from sandbox_service.jail.executor import JailExecutor

__all__ = ["JailExecutor"]
