"""Red-team attacks on the real jail, in warm and cold mode: each asserts the property the attack
would break (host resources shared across jails, the machinery, what a later run sees), and
leaves the executor healthy. The attacks that test_hostile.py already covers are not repeated.
"""

from __future__ import annotations

import ctypes
import os
import signal
import textwrap
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from sandbox_service.execution import ExecutionResult, Status
from tests.jail.conftest import RunFn


def code(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


@pytest.fixture(autouse=True)
def healthy_after(run: RunFn) -> Iterator[None]:
    yield
    after = run("print('still healthy')")
    assert (after.status, after.stdout) == (Status.OK, "still healthy\n"), after


_LIBC = ctypes.CDLL(None, use_errno=True)


def failures_on_the_host_while(
    run: RunFn, program: str, probe: Callable[[], bool], **limits: object
) -> tuple[ExecutionResult, int, int]:
    """Run `program` in the jail; meanwhile call `probe` (an operation of the host's root that
    the program must not be able to starve) every 20 ms. (result, probes, failed probes)."""
    outcome: list[ExecutionResult] = []
    thread = threading.Thread(target=lambda: outcome.append(run(program, **limits)))
    thread.start()
    probes = failed = 0
    while thread.is_alive():
        probes += 1
        failed += not probe()
        time.sleep(0.02)
    thread.join()
    return outcome[0], probes, failed


def host_inotify_instance() -> bool:
    fd = _LIBC.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_inotify_instances_of_the_host_are_not_exhausted(run: RunFn) -> None:
    # inotify instances and watches are counted per user up the user namespaces: a jail's are
    # also charged to the host user that started nsjail (root, 128 instances by default).
    program = code("""
        import ctypes, os, time
        libc = ctypes.CDLL(None, use_errno=True)
        for _ in range(4):  # 4 x 50: past the host's 128, under the jail's descriptor limit
            if os.fork() == 0:
                made = 0
                while made < 50 and libc.inotify_init1(0) >= 0:
                    made += 1
                print(made, flush=True)
                time.sleep(2)
                os._exit(0)
        for _ in range(4):
            os.wait()
        """)
    result, probes, failed = failures_on_the_host_while(run, program, host_inotify_instance)
    assert result.status == Status.OK, result
    assert probes > 10
    assert failed == 0, f"the host's root could not create an inotify instance: {result.stdout}"


class _SigVal(ctypes.Union):
    _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]


def host_queued_signal() -> bool:
    """sigqueue a real-time signal to this process (a handler takes it, in any thread)."""
    return _LIBC.sigqueue(os.getpid(), int(_PROBE_SIGNAL), _SigVal(1)) == 0


_PROBE_SIGNAL = signal.SIGRTMIN + 3


@pytest.fixture
def probe_signal_handled() -> Iterator[None]:
    old = signal.signal(_PROBE_SIGNAL, lambda *_: None)
    yield
    signal.signal(_PROBE_SIGNAL, old)


@pytest.mark.usefixtures("probe_signal_handled")
def test_queued_signals_do_not_exhaust_the_hosts_pending_signal_limit(run: RunFn) -> None:
    # RLIMIT_SIGPENDING is counted per user up the user namespaces, like inotify: a jail's
    # queued signals are also charged to root's count, under root's own limit.
    program = code("""
        import os, signal, time
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
        for _ in range(200_000):
            os.kill(os.getpid(), signal.SIGRTMIN)  # each queues a siginfo while there is room
        print(len(signal.sigpending()))
        time.sleep(2)
        """)
    result, probes, failed = failures_on_the_host_while(run, program, host_queued_signal)
    assert result.status == Status.OK, result
    assert probes > 10
    assert failed == 0, "the host's root could not queue a real-time signal"


def test_unread_loopback_tcp_data_is_bounded_by_the_jail(run: RunFn) -> None:
    # Socket buffers are kernel memory: on cgroup v1 a memory cgroup charges a TCP socket's
    # buffers only once its TCP limit is set. 24 processes fill loopback connections that
    # nobody reads; what the kernel accepted must stay within the run's memory budget.
    program = code("""
        import os, socket, time
        totals_r, totals_w = os.pipe()

        def fill():
            server = socket.create_server(("127.0.0.1", 0))
            address = server.getsockname()
            held, queued = [], 0
            chunk = b"x" * 65536
            try:
                while True:
                    client = socket.create_connection(address)
                    peer, _ = server.accept()
                    held += [client, peer]
                    client.setblocking(False)
                    try:
                        while True:
                            queued += client.send(chunk)
                    except BlockingIOError:
                        pass
            except OSError:  # out of descriptors
                pass
            return held, queued

        for _ in range(24):
            if os.fork() == 0:
                held, queued = fill()
                os.write(totals_w, f"{queued}\\n".encode())
                time.sleep(60)
        os.close(totals_w)
        lines = b""
        with os.fdopen(totals_r, "rb") as f:
            while lines.count(b"\\n") < 24:
                more = f.read1(4096)
                if not more:
                    break
                lines += more
        print(sum(int(x) for x in lines.split()) >> 20)
        """)
    result = run(program, timeout_s=20.0, memory_mb=128)
    assert result.status == Status.OK, result
    queued_mib = int(result.stdout)
    assert queued_mib <= 128, f"{queued_mib} MiB of unread TCP data outside the memory limit"


def test_datagram_sockets_of_the_inet_families_are_refused_and_tcp_still_works(
    run: RunFn,
) -> None:
    # A datagram's receive queue is kernel memory that cgroup v1 charges to no cgroup: loopback
    # UDP queues that nobody reads held host memory far past the run's limit. Every non-stream
    # inet socket must be refused (whatever flags ride on the type), while TCP to itself and
    # Unix datagrams (charged to the run) keep working.
    program = code("""
        import errno, socket
        refused = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for kind, proto in (
                (socket.SOCK_DGRAM, 0),
                (socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
                (socket.SOCK_SEQPACKET, 0),
                (socket.SOCK_RAW, socket.IPPROTO_UDP),
                (socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC, 0),
            ):
                try:
                    socket.socket(family, kind, proto).close()
                    refused.append(f"OPENED {family.name} {kind} {proto}")
                except OSError as exc:
                    refused.append(errno.errorcode.get(exc.errno, str(exc.errno)))
        print(" ".join(refused))
        server = socket.create_server(("127.0.0.1", 0))
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        client.sendall(b"tcp ok")
        print(peer.recv(16).decode())
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        a.send(b"unix ok")
        print(b.recv(16).decode())
        """)
    result = run(program, timeout_s=10.0)
    assert result.status == Status.OK, result
    refused, tcp, unix = result.stdout.splitlines()
    assert "OPENED" not in refused, refused
    assert set(refused.split()) == {"ESOCKTNOSUPPORT"}, refused
    assert (tcp, unix) == ("tcp ok", "unix ok")
