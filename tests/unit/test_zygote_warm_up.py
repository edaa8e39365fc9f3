"""The standby's idle-time warm-up: it yields to a request, and says when it was interrupted.

Each case runs the real function in a fresh interpreter (as a standby is a fresh fork), with
the host-load gate opened so that the warm-up always starts.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

WARM_UP = """
import json, socket, sys
from sandbox_service.jail import zygote
zygote.host_busy = lambda: False
sock = socket.socket(fileno=int(sys.argv[1]))
print("starting", flush=True)
print(json.dumps(zygote.warm_up_while_idle(sock)))
"""


def _warm_up(request_after_s: float | None) -> bool:
    """warm_up_while_idle's answer when a request arrives after the delay (None: never)."""
    ours, theirs = socket.socketpair()
    with ours:
        if request_after_s == 0:
            ours.send(b"request")
        proc = subprocess.Popen(
            [sys.executable, "-c", WARM_UP, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdout=subprocess.PIPE,
        )
        theirs.close()
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"starting\n"
        if request_after_s:
            time.sleep(request_after_s)
            ours.send(b"request")
        stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    return bool(json.loads(stdout))


def test_a_request_already_waiting_skips_the_warm_up() -> None:
    assert _warm_up(0) is True


def test_a_warm_up_left_alone_finishes_and_leaves_a_sound_standby() -> None:
    assert _warm_up(None) is True


def test_a_request_during_the_warm_up_interrupts_it_and_condemns_the_standby() -> None:
    # The first exercise in a fresh interpreter imports numpy and sympy: far longer than 0.1 s.
    assert _warm_up(0.1) is False
