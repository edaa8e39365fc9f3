"""The jail's limits on the real kernel: memory kill, pids limit, CPU throttling, timeout.

A warm executor (nsjail, seccomp, the preloaded zygote) with the default settings (one CPU per
slot) in cgroups that SlotCgroups made; each test checks that the jail still serves the next call.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pytest

from sandbox_service.execution import ExecutionResult, ExecutionSpec, Limits, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.settings import Settings

SETTINGS = Settings(cgroup_parent="rl-sandbox-cg2test")
LIMITS = Limits(timeout_s=20.0, memory_mb=256, max_processes=32, max_output_bytes=4096)


@pytest.fixture(scope="module")
def executor() -> Iterator[JailExecutor]:
    ex = JailExecutor(SETTINGS, slot=12, mode="warm")
    yield ex
    ex.close()


def run(executor: JailExecutor, program: str, **limits: float) -> ExecutionResult:
    fields = {name: getattr(LIMITS, name) for name in LIMITS.__slots__}  # type: ignore[attr-defined]
    spec = ExecutionSpec(
        code=textwrap.dedent(program), stdin="", files={}, fetch_files=(),
        limits=Limits(**{**fields, **limits}),
    )  # fmt: skip
    failures = executor.jail_failures
    result = executor.run(spec)
    assert executor.jail_failures == failures, f"the jail failed under this program: {result}"
    return result


@pytest.fixture(autouse=True)
def still_serves(executor: JailExecutor) -> Iterator[None]:
    yield
    after = run(executor, "print('still healthy')")
    assert (after.status, after.stdout) == (Status.OK, "still healthy\n"), after


def test_memory_bomb_is_killed_by_the_cgroup(executor: JailExecutor) -> None:
    result = run(executor, "x = bytearray(1024**3)\nprint('allocated')", memory_mb=128)
    assert result.status == Status.MEMORY_LIMIT, result
    assert "allocated" not in result.stdout


def test_fork_bomb_stops_at_the_pids_limit(executor: JailExecutor) -> None:
    result = run(
        executor,
        """
        import os, time
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                n += 1
        except OSError as e:
            print(n, e.errno)
        """,
        max_processes=12,
    )
    assert result.status == Status.OK, result
    forked, errno = map(int, result.stdout.split())
    assert forked <= 12
    assert errno == 11  # EAGAIN: the pids controller refused the fork


def test_spin_times_out(executor: JailExecutor) -> None:
    result = run(executor, "while True: pass", timeout_s=2.0)
    assert result.status == Status.TIMEOUT, result
    assert result.exit_code is None


def test_cpu_limit_throttles_every_process_of_the_slot(executor: JailExecutor) -> None:
    # The zygote and all it forks share the slot cgroup's CPU limit. The default (one core) is
    # met only when the host has a core to spare, so the test lowers it to a fifth of a core,
    # which three spinners exceed in any period where they run at all; each spins until it has
    # used 0.3 s of CPU, however long that takes.
    slots = executor._cgroups  # the slot's two cgroups (current jail and standby)
    for cgroups in slots:
        cgroups.set_cpu_limit(0.2)
    before = executor.cpu_throttling()
    assert before is not None
    try:
        result = run(
            executor,
            """
            import os
            pids = [os.fork() for _ in range(3)]
            if 0 in pids:
                while sum(os.times()[:2]) < 0.3:
                    pass
                os._exit(0)
            for pid in pids:
                os.waitpid(pid, 0)
            """,
            timeout_s=120.0,  # 0.9 s of CPU at 0.2 cores, forks included, under emulation
        )
        after = executor.cpu_throttling()
    finally:
        for cgroups in slots:
            cgroups.set_cpu_limit(SETTINGS.slot_cpu_cores)
    assert result.status == Status.OK, result
    assert after is not None
    print(f"three 0.3 s CPU spinners under 0.2 cores: wall {result.wall_time:.2f} s, {after}")
    assert after.throttled_periods > before.throttled_periods
