"""procs.stop: a process late at the deadline writes its stacks when asked, then is killed."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from sandbox_service.local import procs

DEAF_TO_SIGTERM = """
import faulthandler, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
faulthandler.register(signal.SIGUSR2, all_threads=True)
print("ready", flush=True)
def stuck_in_shutdown():
    while True:
        time.sleep(0.05)
stuck_in_shutdown()
"""

OBEDIENT = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"


def _start(code: str, stderr: Path) -> subprocess.Popen[bytes]:
    with stderr.open("wb") as err:
        proc = procs.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def _close(*processes: subprocess.Popen[bytes]) -> None:
    for proc in processes:
        assert proc.stdout is not None
        proc.stdout.close()


def test_a_late_process_dumps_its_stacks_then_is_killed(tmp_path: Path) -> None:
    deaf = _start(DEAF_TO_SIGTERM, tmp_path / "deaf.err")
    obedient = _start(OBEDIENT, tmp_path / "obedient.err")
    killed = procs.stop([deaf, obedient], grace_s=0.5, dump_signal=signal.SIGUSR2)
    _close(deaf, obedient)
    assert killed == {deaf.pid}
    assert deaf.returncode == -signal.SIGKILL
    assert obedient.returncode == -signal.SIGTERM
    dump = (tmp_path / "deaf.err").read_text()
    assert "stuck_in_shutdown" in dump, dump
    assert (tmp_path / "obedient.err").read_text() == ""


def test_without_a_dump_signal_a_late_process_is_killed_at_the_deadline(tmp_path: Path) -> None:
    deaf = _start(DEAF_TO_SIGTERM, tmp_path / "deaf.err")
    assert procs.stop([deaf], grace_s=0.2) == {deaf.pid}
    _close(deaf)
    assert deaf.returncode == -signal.SIGKILL
    assert (tmp_path / "deaf.err").read_text() == ""
