"""The verifier pool's guarantees: bounded waits, killed and replaced workers, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rl_limits import LIMIT_S, MARGIN_S

import rl.reward.verifier
from rl.reward.verifier import VerifierError, VerifierPool

HANG = ("9^{9^{9^9}}", "1")


def test_check_is_bounded_even_while_every_worker_restarts(hard_verifier: VerifierPool) -> None:
    restarts = hard_verifier.restarts
    assert [v.status for v in hard_verifier.check_many([HANG, HANG])] == ["timeout", "timeout"]
    assert hard_verifier.restarts == restarts + 2
    # Both workers are now importing sympy again (seconds); a single check must not wait for them.
    start = time.monotonic()
    verdict = hard_verifier.check("7", "7")
    assert time.monotonic() - start < LIMIT_S + MARGIN_S
    assert verdict.status in ("unavailable", "ok")
    assert verdict.equal == (verdict.status == "ok")
    # A batch waits for the replacements instead, and loses no verdict to them.
    assert [v.equal for v in hard_verifier.check_many([("7", "7"), ("8", "7")])] == [True, False]


def test_a_deadline_bounds_a_whole_batch(hard_verifier: VerifierPool) -> None:
    # Two workers, three hanging items, one limit for the call: two run out of time, the third
    # never gets a worker.
    start = time.monotonic()
    verdicts = hard_verifier.check_many([HANG] * 3, deadline=start + LIMIT_S)
    assert time.monotonic() - start < LIMIT_S + MARGIN_S
    assert sorted(v.status for v in verdicts) == ["timeout", "timeout", "unavailable"]
    assert not any(v.equal for v in verdicts)
    assert [v.equal for v in hard_verifier.check_many([("9", "9")])] == [True]


def test_a_worker_that_dies_mid_check_is_reported_and_replaced() -> None:
    # A limit far above the kill: a crash must be reported when it happens, not at the limit.
    with VerifierPool(workers=2, timeout_s=60.0, soft_timeout=False) as pool:
        pool.check_many([("1", "1")] * 2)  # both workers up
        pids = pool.worker_pids()
        # Killed once a worker is busy on the check (not after a fixed delay, which a loaded
        # machine can reach before the check is even sent: then it hangs on a new worker).
        killer = threading.Thread(target=_kill_when_busy, args=(pids,))
        killer.start()
        start = time.monotonic()
        (verdict,) = pool.check_many([HANG])
        killer.join()
        assert verdict.status == "crashed" and not verdict.equal
        assert time.monotonic() - start < 30.0
        assert [v.equal for v in pool.check_many([("2", "2"), ("3", "2")])] == [True, False]
        assert len(set(pool.worker_pids()) - set(pids)) == 1  # the killed one's replacement


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def _kill_when_busy(pids: list[int], busy_ticks: int = 20, give_up_s: float = 25.0) -> None:
    """SIGKILL the worker that has spent `busy_ticks` of CPU since the call (every one, if none
    has by `give_up_s`). The idle one is spared: killed too, it would be dead, and not yet
    reaped, when the next check is sent to it, and that check would be reported crashed."""
    start = {pid: _cpu_ticks(pid) for pid in pids}
    deadline = time.monotonic() + give_up_s
    busy = pids
    while time.monotonic() < deadline:
        busy = [pid for pid in pids if _cpu_ticks(pid) - start[pid] >= busy_ticks]
        if busy:
            break
        busy = pids
        time.sleep(0.02)
    for pid in busy:
        os.kill(pid, signal.SIGKILL)


def test_workers_that_do_not_start_in_time_raise() -> None:
    # A fork and a first parse take far more than a millisecond.
    with pytest.raises(VerifierError, match="did not start"):
        VerifierPool(workers=1, timeout_s=LIMIT_S, startup_timeout_s=0.001)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_die_with_the_trainer() -> None:
    # A "trainer" starts a pool and dies without closing it: its workers must not outlive it
    # (one stuck in a check would otherwise spin on for as long as sympy likes).
    trainer = (
        "import os\n"
        "from rl.reward.verifier import VerifierPool\n"
        "pool = VerifierPool(workers=1)\n"
        "print(*pool.worker_pids(), flush=True)\n"
        "os._exit(0)\n"
    )
    root = str(Path(rl.reward.verifier.__file__).resolve().parent.parent)
    out = subprocess.run(
        [sys.executable, "-c", trainer],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=root),
        check=True,
    )
    (worker_pid,) = map(int, out.stdout.split())
    deadline = time.monotonic() + 10
    while _alive(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker_pid)
