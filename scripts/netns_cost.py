"""What a network namespace per run would cost: a forked child that exits, one that also
unshares a network namespace, one that then brings its loopback up; wall time and CPU per fork.

    .venv/bin/python scripts/netns_cost.py [--forks 200]

Needs root (CAP_SYS_ADMIN for unshare, CAP_NET_ADMIN for the interface). The CPU counts this
process and its children; the namespace's teardown runs in a kernel worker after the child
exits, which shows in the wall time of the next fork.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import socket
import struct
import time

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def child(mode: str) -> None:
    if mode != "fork":
        os.unshare(os.CLONE_NEWNET)
    if mode == "netns+lo":
        with socket.socket() as sock:
            request = struct.pack("16sH", b"lo", 0)
            flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request)[:18])[1]
            fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))
    os._exit(0)


def cpu_s() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--forks", type=int, default=200)
    args = parser.parse_args()
    for mode in ("fork", "netns", "netns+lo"):
        started, cpu_before = time.perf_counter(), cpu_s()
        for _ in range(args.forks):
            pid = os.fork()
            if pid == 0:
                child(mode)
            os.waitpid(pid, 0)
        wall = (time.perf_counter() - started) / args.forks * 1000
        cpu = (cpu_s() - cpu_before) / args.forks * 1000
        print(f"{mode:10s} wall {wall:.2f} ms per fork, CPU {cpu:.2f} ms")


if __name__ == "__main__":
    main()
