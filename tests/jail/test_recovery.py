"""A jail that dies under an execution: the execution runs again on a fresh jail, once."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from sandbox_service.execution import ExecutionSpec, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT

SLOW_PRINT = ExecutionSpec(code="import time\ntime.sleep(1.5)\nprint('done')")


@pytest.fixture
def executor() -> Iterator[JailExecutor]:
    ex = JailExecutor(Settings(cgroup_parent=JAIL_CGROUP_PARENT), slot=11, mode="warm")
    yield ex
    ex.close()


def _kill_zygotes_mid_run(executor: JailExecutor, count: int) -> tuple[threading.Thread, list[int]]:
    """In the background: `count` times, kill the zygote serving the run 0.5 s into it."""
    killed: list[int] = []

    def kill() -> None:
        deadline = time.monotonic() + 60
        while len(killed) < count and time.monotonic() < deadline:
            pid = executor.zygote_pid()
            if pid is None or pid in killed:
                time.sleep(0.02)
                continue
            time.sleep(0.5)
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    thread = threading.Thread(target=kill)
    thread.start()
    return thread, killed


def test_an_execution_whose_jail_dies_runs_again_on_a_fresh_jail(executor: JailExecutor) -> None:
    killer, killed = _kill_zygotes_mid_run(executor, count=1)
    result = executor.run(SLOW_PRINT)
    killer.join()
    assert len(killed) == 1
    assert (result.status, result.stdout) == (Status.OK, "done\n")
    assert executor.jail_failures == 1
    assert executor.zygote_pid() not in (None, *killed)


def test_a_second_jail_death_is_a_sandbox_error_and_the_slot_recovers(
    executor: JailExecutor,
) -> None:
    killer, killed = _kill_zygotes_mid_run(executor, count=2)
    result = executor.run(SLOW_PRINT)
    killer.join()
    assert len(killed) == 2
    assert result.status == Status.SANDBOX_ERROR
    assert executor.jail_failures == 2
    assert "zygote connection lost" in result.stderr
    after = executor.run(ExecutionSpec(code="print('fine')"))
    assert (after.status, after.stdout) == (Status.OK, "fine\n")


def test_jails_start_while_another_thread_rewrites_the_environment() -> None:
    # Cold mode starts each next jail in a background thread. Python releases the GIL around
    # the vfork of nsjail, so the main thread runs meanwhile; pytest itself sets an environment
    # variable at every test phase. With the process's global environ, execve then read a
    # rewritten array and failed with EFAULT ("jail did not start: [Errno 14] Bad address").
    ex = JailExecutor(Settings(cgroup_parent=JAIL_CGROUP_PARENT), slot=12, mode="cold")
    stop = threading.Event()
    names = [f"RL_SANDBOX_TEST_CHURN_{i}" for i in range(40)]

    def churn() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            os.environ[names[i % len(names)]] = "x" * (i % 300)
            if i % 7 == 0:
                os.environ.pop(names[(i * 3) % len(names)], None)

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    try:
        results = [ex.run(ExecutionSpec(code=f"print({i})")) for i in range(25)]
    finally:
        stop.set()
        churner.join()
        for name in names:
            os.environ.pop(name, None)
        ex.close()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(25)]
    assert ex.jail_failures == 0
