"""The default-deny seccomp policy against the real jail: the scientific stack, multiprocessing,
threads, subprocesses and loopback sockets work in warm, cold and session mode; a call outside
the allow-list fails with an errno (a Python exception, never a kill) and the jail keeps serving."""

from __future__ import annotations

import platform
import textwrap
from collections.abc import Iterator

import pytest

from sandbox_service.execution import ExecutionSpec, Limits, Status
from sandbox_service.jail.sessions import SessionPool
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT
from tests.jail.conftest import RunFn

LIMITS = dict(timeout_s=60.0, memory_mb=1024, max_processes=64, max_output_bytes=65536)

WORKLOADS = {
    "numpy-linalg": (
        "import numpy as np\na = np.array([[2.0, 1.0], [1.0, 3.0]])\n"
        "print(np.round(np.linalg.solve(a, [3.0, 5.0]), 6).tolist(), "
        "np.round(sorted(np.linalg.eigvalsh(a)), 3).tolist())",
        "[0.8, 1.4] [1.382, 3.618]\n",
    ),
    "scipy-optimize": (
        "from scipy.optimize import minimize\n"
        "r = minimize(lambda v: (v[0] - 1) ** 2 + (v[1] + 2) ** 2, [0.0, 0.0])\n"
        "print([round(float(c), 3) for c in r.x])",
        "[1.0, -2.0]\n",
    ),
    "sympy-solve": (
        "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve(x**2 - 4*x + 3, x))",
        "[1, 3]\n",
    ),
    "matplotlib-agg": (
        "import matplotlib\nimport matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
        "ax.plot([1, 2, 3]); ax.set_title('t')\nfig.savefig('/tmp/f.png')\nplt.close(fig)\n"
        "print(matplotlib.get_backend(), open('/tmp/f.png', 'rb').read(4) == b'\\x89PNG')",
        "Agg True\n",
    ),
    "multiprocessing-pool": (
        "import multiprocessing as mp\ndef sq(v):\n    return v * v\n"
        "with mp.Pool(2) as pool:\n    print(sum(pool.map(sq, range(10))))",
        "285\n",
    ),
    "threads": (
        "import threading\nout = []\nts = [threading.Thread(target=out.append, args=(i,)) "
        "for i in range(8)]\nfor t in ts: t.start()\nfor t in ts: t.join()\nprint(sorted(out))",
        "[0, 1, 2, 3, 4, 5, 6, 7]\n",
    ),
    "subprocess-python": (
        "import subprocess, sys\n"
        "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, "
        "text=True, check=True).stdout, end='')",
        "42\n",
    ),
    "loopback-socket": (
        "import socket, threading\nsrv = socket.create_server(('127.0.0.1', 0))\n"
        "def serve():\n    c, _ = srv.accept()\n    c.sendall(c.recv(16).upper())\n"
        "threading.Thread(target=serve).start()\n"
        "c = socket.create_connection(('localhost', srv.getsockname()[1]))\nc.sendall(b'ping')\n"
        "print(c.recv(16).decode())",
        "PING\n",
    ),
}

DENIED = textwrap.dedent("""\
    import ctypes, os, socket
    libc = ctypes.CDLL(None, use_errno=True)
    calls = {"ptrace": 101, "mount": 165, "personality": 135, "keyctl": 250, "kexec_load": 246,
             "perf_event_open": 298, "unshare": 272, "setns": 308, "userfaultfd": 323,
             "bpf": 321, "io_uring_setup": 425, "msgget": 68, "unknown-999": 999}
    for name, number in calls.items():
        ctypes.set_errno(0)
        print(name, libc.syscall(number, 0, 0, 0, 0, 0), ctypes.get_errno())
    for family, kind, proto in ((socket.AF_PACKET, socket.SOCK_RAW, 0),
                                (socket.AF_NETLINK, socket.SOCK_RAW, 9)):
        try:
            socket.socket(family, kind, proto)
            print("socket opened")
        except OSError as e:
            print("socket", e.errno)
    try:
        os.unshare(os.CLONE_NEWUSER)
    except PermissionError as e:
        print("os.unshare", e.errno)
""")
DENIED_ANSWERS = (
    "ptrace -1 1\nmount -1 1\npersonality -1 1\nkeyctl -1 1\nkexec_load -1 1\n"
    "perf_event_open -1 1\nunshare -1 1\nsetns -1 1\nuserfaultfd -1 1\nbpf -1 1\n"
    "io_uring_setup -1 38\nmsgget -1 38\nunknown-999 -1 38\n"
    "socket 97\nsocket 97\nos.unshare 1\n"
)
"""EPERM for the calls that leave or widen the jail, ENOSYS for io_uring, IPC and anything
unknown, EAFNOSUPPORT for socket families outside the list."""

x86_64_only = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="the probe uses x86-64 system call numbers"
)


@pytest.fixture
def healthy_after(run: RunFn) -> Iterator[None]:
    yield
    after = run("print('still healthy')")
    assert (after.status, after.stdout) == (Status.OK, "still healthy\n"), after


@pytest.mark.usefixtures("healthy_after")
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workloads_run_under_the_allow_list(run: RunFn, name: str) -> None:
    program, expected = WORKLOADS[name]
    result = run(program, **LIMITS)
    assert (result.status, result.stdout) == (Status.OK, expected), result


@x86_64_only
@pytest.mark.usefixtures("healthy_after")
def test_calls_outside_the_allow_list_fail_with_an_errno(run: RunFn) -> None:
    result = run(DENIED)
    assert result.status == Status.OK, f"a denied call killed the program: {result}"
    assert result.stdout == DENIED_ANSWERS, result.stdout


@pytest.fixture(scope="module")
def pool() -> Iterator[SessionPool]:
    settings = Settings(cgroup_parent=JAIL_CGROUP_PARENT, max_sessions_per_worker=2)
    p = SessionPool(settings, slot=13, spares=0)
    yield p
    p.close()


@x86_64_only
def test_session_cells_run_the_workloads_and_survive_denied_calls(pool: SessionPool) -> None:
    limits = Limits(**LIMITS)  # type: ignore[arg-type]
    for name, (program, expected) in WORKLOADS.items():
        outcome = pool.run_cell("s-seccomp", ExecutionSpec(code=program, limits=limits))
        assert (outcome.result.status, outcome.result.stdout) == (Status.OK, expected), name
    denied = pool.run_cell("s-seccomp", ExecutionSpec(code=DENIED, limits=limits))
    assert denied.result.stdout == DENIED_ANSWERS and denied.alive, denied
    kept = pool.run_cell("s-seccomp", ExecutionSpec(code="print(sq(3))", limits=limits))
    assert kept.result.stdout == "9\n", f"the session lost its state: {kept}"
