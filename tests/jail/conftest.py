"""Fixtures: a real jailed executor (nsjail, seccomp, cgroups) in each mode."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from sandbox_service.execution import ExecutionResult, ExecutionSpec, Limits
from sandbox_service.jail import JailExecutor
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT

RunFn = Callable[..., ExecutionResult]

TEST_LIMITS = Limits(timeout_s=5.0, memory_mb=512, max_processes=32, max_output_bytes=4096)


@pytest.fixture(scope="module", params=["warm", "lean", "cold"])
def executor(request: pytest.FixtureRequest) -> Iterator[JailExecutor]:
    """warm: the data zygote (the one a slot with one zygote keeps); lean: a slot's lean zygote
    (jail/zygotes.py), which runs every program that imports only the standard library; cold: a
    jail per run. The math zygote differs from the data one only in its preload
    (tests/jail/test_zygote_choice.py)."""
    settings = Settings(cgroup_parent=JAIL_CGROUP_PARENT, max_open_files=64)
    if request.param == "lean":
        ex = JailExecutor(settings, slot=7, mode="warm", zygote="lean")
    else:
        ex = JailExecutor(settings, slot=7, mode=request.param)
    yield ex
    ex.close()


@pytest.fixture(scope="module")
def warm_executor() -> Iterator[JailExecutor]:
    ex = JailExecutor(Settings(cgroup_parent=JAIL_CGROUP_PARENT), slot=8, mode="warm")
    yield ex
    ex.close()


@pytest.fixture
def run(executor: JailExecutor) -> RunFn:
    """Run code with the test limits, overridable by keyword; checks the executor stays healthy."""

    def _run(
        code: str,
        stdin: str = "",
        files: dict[str, bytes] | None = None,
        fetch_files: tuple[str, ...] = (),
        seed: int | None = None,
        **limit_overrides: object,
    ) -> ExecutionResult:
        limits = Limits(**{**_limits_dict(TEST_LIMITS), **limit_overrides})  # type: ignore[arg-type]
        spec = ExecutionSpec(
            code=code,
            stdin=stdin,
            files=files or {},
            fetch_files=fetch_files,
            limits=limits,
            seed=seed,
        )
        failures = executor.jail_failures
        result = executor.run(spec)
        # The executor retries a run whose jail failed: that must not hide a program that
        # breaks the jail.
        assert executor.jail_failures == failures, f"the jail failed under this program: {result}"
        return result

    return _run


def _limits_dict(limits: Limits) -> dict[str, object]:
    return {name: getattr(limits, name) for name in limits.__slots__}  # type: ignore[attr-defined]
