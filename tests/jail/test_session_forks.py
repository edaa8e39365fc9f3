"""Forked sessions at the jail level: copy-on-write copies of a live interpreter in its jail,
each then on its own; hostile forks reach neither a sibling's state nor its files."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sandbox_service.execution import ExecutionSpec, Limits, Status
from sandbox_service.jail.sessions import InterpreterGone, SessionPool
from sandbox_service.settings import Settings

LIMITS = Limits(timeout_s=10.0, memory_mb=512, max_processes=64, max_output_bytes=4096)


@pytest.fixture(scope="module")
def pool() -> Iterator[SessionPool]:
    settings = Settings(
        cgroup_parent="rl-sandbox-test", max_sessions_per_worker=12, session_ttl_s=60
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


def test_a_fork_whose_files_cannot_be_set_aside_gives_up_only_its_own_live_state(
    pool: SessionPool,
) -> None:
    run(pool, "up", "z = 3")
    pool.fork("up", ["u1"])
    run(pool, "u1", DEEP)  # deeper than the zygote's tar recurses
    assert run(pool, "up", "import os\nz, os.listdir('.')") == "(3, [])\n"
    with pytest.raises(InterpreterGone):
        pool.run_cell("u1", ExecutionSpec(code="z", limits=LIMITS))
    assert run(pool, "up", "z") == "3\n"
    pool.end("up")


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
