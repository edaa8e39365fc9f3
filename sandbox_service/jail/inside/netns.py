"""The loopback between runs: a run that used the jail's network namespace leaves it behind.

A warm jail's runs share one network namespace (its loopback only). A run that used it moved
the loopback's packet counters, and may have left sockets (TIME_WAIT holds its ports for a
minute) that the next run, possibly another tenant's, would see. So after such a run the
zygote moves into a fresh namespace with the loopback up before it forks the next standby:
after the answer, off the critical path. A run that never touched the network costs one read
of /proc/self/net/dev.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct

_SIOCSIFFLAGS = 0x8914
_IFF_UP, _IFF_LOOPBACK, _IFF_RUNNING = 0x1, 0x8, 0x40
_BASELINE: list[int] = [-1]
"""The loopback's packet count when the namespace was made (main sets it before serving)."""


def loopback_packets() -> int:
    """Packets the loopback received and sent in this process's namespace (-1: none found)."""
    with open("/proc/self/net/dev", "rb") as dev:
        for line in dev.read().splitlines()[2:]:
            name, _, counters = line.partition(b":")
            if name.strip() == b"lo":
                fields = counters.split()
                return int(fields[1]) + int(fields[9])
    return -1


def note_baseline() -> None:
    _BASELINE[0] = loopback_packets()


def fresh_if_used() -> bool:
    """A fresh network namespace for this process (and what it forks next) if the last run
    moved the loopback's counters; whether it made one."""
    if loopback_packets() == _BASELINE[0]:
        return False
    os.unshare(os.CLONE_NEWNET)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # seccomp refuses UDP
        request = struct.pack("16sH14x", b"lo", _IFF_UP | _IFF_LOOPBACK | _IFF_RUNNING)
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, request)
    note_baseline()
    return True
