"""Forked sessions at the jail level: copy-on-write copies of a live interpreter in its jail,
each then on its own; hostile forks reach neither a sibling's state nor its files."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sandbox_service.execution import ExecutionSpec, Limits, Status
from sandbox_service.jail.sessions import InterpreterGone, SessionPool
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT

LIMITS = Limits(timeout_s=10.0, memory_mb=512, max_processes=64, max_output_bytes=4096)


@pytest.fixture(scope="module")
def pool() -> Iterator[SessionPool]:
    settings = Settings(
        cgroup_parent=JAIL_CGROUP_PARENT, max_sessions_per_worker=12, session_ttl_s=60
    )
    p = SessionPool(settings, slot=11, spares=1)
    yield p
    p.close()


def run(pool: SessionPool, session: str, code: str) -> str:
    outcome = pool.run_cell(session, ExecutionSpec(code=code, limits=LIMITS))
    assert outcome.result.status == Status.OK, outcome.result
    assert not outcome.restored
    return outcome.result.stdout


def test_forks_copy_the_interpreter_and_its_files_then_live_apart(pool: SessionPool) -> None:
    run(pool, "p", "import fractions, os\nx = [41]\nopen('w.txt', 'w').write('parent')\nNone")
    run(pool, "p", "open('/tmp/t.txt', 'w').write('tmp')\nf = fractions.Fraction(1, 3)\nNone")
    started = time.perf_counter()
    assert pool.fork("p", ["a", "b"]) == []
    fork_s = time.perf_counter() - started
    probe = "print(x, f, open('w.txt').read(), open('/tmp/t.txt').read(), sorted(os.listdir('.')))"
    assert run(pool, "a", probe) == "[41] 1/3 parent tmp ['w.txt']\n"
    run(pool, "a", "x.append('a')\nopen('w.txt', 'w').write('a')\nopen('mine', 'w').close()")
    run(pool, "p", "x.append('p')\nopen('w.txt', 'w').write('p later')\nNone")
    assert run(pool, "b", probe) == "[41] 1/3 parent tmp ['w.txt']\n"
    assert run(pool, "a", probe) == "[41, 'a'] 1/3 a tmp ['mine', 'w.txt']\n"
    assert run(pool, "p", probe) == "[41, 'p'] 1/3 p later tmp ['w.txt']\n"
    # Each fork draws its own random numbers.
    draws = {run(pool, s, "import random\nrandom.random()") for s in ("a", "b")}
    assert len(draws) == 2
    # A fork ends alone; the jail lives on for the others.
    assert pool.end("a")
    assert run(pool, "b", "x") == "[41]\n" and run(pool, "p", "len(x)") == "2\n"
    print(f"fork of 2: {fork_s * 1000:.1f} ms")
    pool.end("b")
    pool.end("p")


HOSTILE = """
import os, signal
me = os.getpid()
listed = [int(name) for name in os.listdir('/proc') if name.isdigit() and int(name) != me]
found, read = [], []
for pid in range(2, 4096):  # pids are small in the jail's namespace: guess them
    try:
        if pid == me:
            continue
        os.kill(pid, 0)
    except OSError:
        continue
    found.append(pid)
    try:
        with open(f'/proc/{pid}/mem', 'rb') as mem:
            read.append(pid)
    except OSError:
        pass
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
print(listed, len(found) > 0, read)
"""


def test_a_hostile_fork_reaches_no_sibling_state_and_a_killed_one_is_rebuilt(
    pool: SessionPool,
) -> None:
    run(pool, "hp", "secret = 'before'")
    pool.fork("hp", ["h1", "h2"])
    run(pool, "h2", "secret = 'h2 only'\nopen('/tmp/h2', 'w').write('x')\nNone")
    # h1 cannot list its siblings (non-dumpable: hidepid hides them), nor read their memory;
    # their pids can be guessed (one jail, one uid) and killed.
    assert run(pool, "h1", HOSTILE) == "[] True []\n"
    assert run(pool, "h1", "import os\nsecret, os.path.exists('/tmp/h2')") == "('before', False)\n"
    # A killed sibling's next cell is for its worker to rebuild from its records.
    with pytest.raises(InterpreterGone):
        pool.run_cell("h2", ExecutionSpec(code="secret", limits=LIMITS))
    assert not pool.is_live("h2")
    for session in ("h1", "hp"):
        pool.end(session)


def test_a_fork_that_times_out_ends_alone(pool: SessionPool) -> None:
    run(pool, "tp", "y = 7")
    pool.fork("tp", ["t1"])
    short = Limits(timeout_s=0.5, memory_mb=512, max_processes=64, max_output_bytes=4096)
    outcome = pool.run_cell("t1", ExecutionSpec(code="while True: pass", limits=short))
    assert outcome.result.status == Status.TIMEOUT and not outcome.alive
    assert run(pool, "tp", "y") == "7\n"
    pool.end("tp")


DEEP = """
import os
for _ in range(1500):
    os.mkdir('d')
    os.chdir('d')
os.chdir('/home/sandbox')
"""


def test_a_forks_locked_files_are_set_aside_and_put_back_as_its_own(pool: SessionPool) -> None:
    run(pool, "lp", "import os\nos.mkdir('shared')")
    pool.fork("lp", ["l1"])
    run(pool, "l1", "os.chdir('shared')\nos.mkdir('locked')\nos.chmod('locked', 0)\nNone")
    assert run(pool, "lp", "os.getcwd(), os.listdir('shared')") == "('/home/sandbox', [])\n"
    # Back on fresh mounts: its directory (by path), its files, its own (mode 0, the program's).
    check = "s = os.stat('locked')\nos.getcwd(), oct(s.st_mode & 0o777), s.st_uid == os.getuid()"
    assert run(pool, "l1", check) == "('/home/sandbox/shared', '0o0', True)\n"
    pool.end("l1")
    pool.end("lp")


DEPTH = """
import os
n = 0
while os.path.isdir('d'):
    os.chdir('d')
    n += 1
os.chdir('/home/sandbox')
z, n
"""


def test_a_forks_deep_tree_is_held_as_it_is_and_copied_into_its_forks(pool: SessionPool) -> None:
    run(pool, "up", "z = 3")
    pool.fork("up", ["u1"])
    run(pool, "u1", DEEP)  # deeper than a recursive walk goes (the zygote's tar gave it up)
    assert run(pool, "up", "import os\nz, os.listdir('.')") == "(3, [])\n"
    assert run(pool, "u1", DEPTH) == "(3, 1500)\n"
    pool.fork("u1", ["u2"])
    assert run(pool, "u2", DEPTH) == "(3, 1500)\n"
    for session in ("u2", "u1", "up"):
        pool.end(session)


SPARSE = """
import os
for path in ('/home/sandbox/s', '/tmp/s', '/mnt/s', '/dev/shm/s'):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY)
    os.ftruncate(fd, 60 << 20)
    os.pwrite(fd, b'end', (60 << 20) - 3)
    os.close(fd)
"""
SPARSE_PROBE = """
import os
paths = ('/home/sandbox/s', '/tmp/s', '/mnt/s', '/dev/shm/s')
sizes = {os.stat(p).st_size for p in paths}
blocks = max(os.stat(p).st_blocks for p in paths)
with open('/tmp/s', 'rb') as f:
    f.seek(-3, 2)
    print(sizes == {60 << 20}, blocks * 512 <= 64 << 10, f.read())
"""


def _zygote_memory_bytes(pool: SessionPool, session: str) -> int:
    for directory in pool._live[session].cgroups.run_dirs:
        for name in ("memory.current", "memory.usage_in_bytes"):
            if (directory.parent / "zygote" / name).exists():
                return int((directory.parent / "zygote" / name).read_text())
    raise AssertionError("no memory cgroup")


def test_a_forks_sparse_files_stay_holes_and_out_of_the_zygotes_memory(
    pool: SessionPool,
) -> None:
    # Issue 35: a fork of a session with four sparse 60 MiB files made its zygote read the
    # holes as bytes into its heap (244 MiB, in a cgroup without a memory limit).
    run(pool, "sp", SPARSE)
    before = _zygote_memory_bytes(pool, "sp")
    pool.fork("sp", ["s1", "s2"])
    assert run(pool, "s1", SPARSE_PROBE) == "True True b'end'\n"
    assert run(pool, "sp", SPARSE_PROBE) == "True True b'end'\n"
    assert run(pool, "s2", SPARSE_PROBE) == "True True b'end'\n"
    grown = _zygote_memory_bytes(pool, "sp") - before
    assert grown < 16 << 20, f"the zygote's cgroup grew by {grown >> 20} MiB"
    for session in ("s1", "s2", "sp"):
        pool.end(session)


def test_forks_fit_under_a_small_process_limit(pool: SessionPool) -> None:
    few = Limits(timeout_s=10.0, memory_mb=512, max_processes=4, max_output_bytes=4096)
    assert pool.run_cell("pp", ExecutionSpec(code="w = 5", limits=few)).alive
    pool.fork("pp", [f"pp{i}" for i in range(8)])
    # Each cell may still start its own processes, beside the family's nine interpreters.
    code = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'pass'], check=True)\nw"
    for session in ("pp7", "pp0", "pp"):
        outcome = pool.run_cell(session, ExecutionSpec(code=code, limits=few))
        assert outcome.result.stdout == "5\n", outcome.result
    pool.end("pp")
    for i in range(8):
        pool.end(f"pp{i}")


PRINCIPAL = """
import os
caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]
links = []
for fd in os.listdir('/proc/self/fd'):
    try:
        links.append(os.readlink(f'/proc/self/fd/{fd}'))
    except OSError:
        pass  # listdir's own descriptor, closed since
in_run = any(line.strip().endswith('/run') for line in open('/proc/self/cgroup'))
os.getresuid(), caps, sum(link.startswith('socket:') for link in links), in_run
"""


def test_a_fork_is_the_program_in_the_run_cgroup_holding_only_its_channel(
    pool: SessionPool,
) -> None:
    run(pool, "op", "import os\nkeep = 1")
    pool.fork("op", ["o1"])
    # The program's uid without capabilities, one socket (its own channel to the zygote), and
    # the run cgroup (the OOM domain), as the session's own interpreter.
    expected = "((1000, 1000, 1000), ['0000000000000000'], 1, True)\n"
    assert run(pool, "o1", PRINCIPAL) == expected
    assert run(pool, "op", PRINCIPAL) == expected
    tight = Limits(timeout_s=20.0, memory_mb=256, max_processes=64, max_output_bytes=4096)
    hog = ExecutionSpec(
        code="b = bytearray(400 << 20)\nb[::4096] = b'x' * len(b[::4096])", limits=tight
    )
    outcome = pool.run_cell("o1", hog)
    # The memory limit's kill is the fork's (the run cgroup's), never the zygote's: the
    # parent lives on in the same jail.
    assert outcome.result.status == Status.MEMORY_LIMIT and not outcome.alive, outcome.result
    assert run(pool, "op", "keep") == "1\n"
    pool.end("op")


AT_FORK = """
import os, subprocess, sys
ran = []
def daemon():
    ran.append('child')
    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
os.register_at_fork(
    before=lambda: ran.append('before'),
    after_in_parent=lambda: ran.append('parent'),
    after_in_child=daemon,
)
"""
OTHERS = """
import os
me = os.getpid()
ran, [p for p in os.listdir('/proc') if p.isdigit() and int(p) != me]
"""


def test_a_fork_runs_none_of_the_programs_at_fork_handlers_and_leaves_no_process(
    pool: SessionPool,
) -> None:
    # Issue 35: a handler that starts a daemon at the fork left it running beside the family.
    run(pool, "ap", AT_FORK)
    pool.fork("ap", ["a1"])
    assert run(pool, "ap", OTHERS) == "([], [])\n"
    assert run(pool, "a1", OTHERS) == "([], [])\n"
    pool.end("a1")
    pool.end("ap")


def _memory_limit_bytes(pool: SessionPool, session: str) -> int:
    for directory in pool._live[session].cgroups.run_dirs:
        for name in ("memory.max", "memory.limit_in_bytes"):
            if (directory / name).exists():
                return int((directory / name).read_text())
    raise AssertionError("no memory cgroup")


def test_a_fork_raises_no_limit(pool: SessionPool) -> None:
    small = Limits(timeout_s=10.0, memory_mb=128, max_processes=8, max_output_bytes=4096)
    assert pool.run_cell("rp", ExecutionSpec(code="v = 1", limits=small)).alive
    before = _memory_limit_bytes(pool, "rp")
    pool.fork("rp", ["r1", "r2"])
    assert _memory_limit_bytes(pool, "rp") == before
    pool.end("r1")
    pool.end("r2")
    pool.end("rp")


READ_SIBLING = """
import os
me, seen = os.getpid(), []
for pid in range(2, 4096):
    if pid == me:
        continue
    try:
        with open(f'/proc/{pid}/mem', 'rb') as mem:
            mem.seek(address)
            seen.append(mem.read(len(secret)))
    except OSError:
        pass
seen
"""


def test_a_member_made_dumpable_is_ended_before_a_siblings_cell(pool: SessionPool) -> None:
    # Issue 35: a member that made itself dumpable again had its memory read (and written) by
    # a sibling through /proc/<pid>/mem: one rollout reading another's state.
    setup = "import ctypes\nsecret = bytearray(b'parent-state!')\n"
    setup += "address = ctypes.addressof(ctypes.c_char.from_buffer(secret))"
    run(pool, "mp", setup)
    pool.fork("mp", ["m1"])
    run(pool, "m1", "secret[:] = b'm1-own-state!'\nctypes.CDLL(None).prctl(4, 1, 0, 0, 0)")
    assert run(pool, "mp", READ_SIBLING) == "[]\n"
    with pytest.raises(InterpreterGone):
        pool.run_cell("m1", ExecutionSpec(code="secret", limits=LIMITS))
    assert run(pool, "mp", "secret") == "bytearray(b'parent-state!')\n"
    pool.end("mp")


def test_a_session_holding_more_than_its_cells_limit_ends_as_its_own_failure(
    pool: SessionPool,
) -> None:
    # The cell's memory limit cannot be set below what the session's interpreters hold (EBUSY
    # on cgroup v1): the program's status, its whole family ended, never sandbox_error.
    hold = "b = bytearray(300 << 20)\nb[::4096] = b'x' * len(b[::4096])"
    assert pool.run_cell("bp", ExecutionSpec(code=hold, limits=LIMITS)).alive
    pool.fork("bp", ["b1"])
    small = Limits(timeout_s=10.0, memory_mb=128, max_processes=64, max_output_bytes=4096)
    outcome = pool.run_cell("bp", ExecutionSpec(code="len(b)", limits=small))
    assert outcome.result.status == Status.MEMORY_LIMIT and not outcome.alive, outcome.result
    assert not pool.is_live("bp") and not pool.is_live("b1")


def test_a_fork_of_an_interpreter_with_threads_holds_only_its_own(pool: SessionPool) -> None:
    # fork(2) without the interpreter's handlers copies the calling thread alone; the copy's
    # threading module forgets the others, as after os.fork.
    start = "import threading\nstop = threading.Event()\nt = threading.Thread(target=stop.wait)\n"
    run(
        pool,
        "tp2",
        start + "t.start()\nran = []\nimport os\nos.register_at_fork(before=lambda: ran.append(1))",
    )
    pool.fork("tp2", ["tc"])
    probe = "n = threading.active_count()\nu = threading.Thread(target=lambda: None)\n"
    probe += "u.start()\nu.join()\nn, t.is_alive(), ran"
    assert run(pool, "tc", probe) == "(1, False, [])\n"
    assert run(pool, "tp2", probe) == "(2, True, [])\n"
    run(pool, "tp2", "stop.set()\nt.join()")
    pool.end("tc")
    pool.end("tp2")


def test_forks_get_the_files_of_the_fork_even_when_some_end_before_their_turn(
    pool: SessionPool,
) -> None:
    run(pool, "qp", "open('f', 'w').write('at fork')")
    pool.fork("qp", ["q1", "q2", "q3"])
    run(pool, "qp", "open('f', 'w').write('later')")
    pool.end("q2")  # never ran: its copy of the parent's files is never made
    read = "print(open('f').read())"
    assert run(pool, "q3", read) == "at fork\n"
    assert run(pool, "q1", read) == "at fork\n"  # the last to come: the snapshot's own mounts
    assert run(pool, "qp", read) == "later\n"
    for session in ("q1", "q3", "qp"):
        pool.end(session)
