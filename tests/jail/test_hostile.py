"""Hostile programs against the real jail, in warm and cold mode: each gets the right status
and leaves the executor healthy for the next call."""

from __future__ import annotations

import hashlib
import signal
import textwrap
import time

import pytest

from sandbox_service.execution import ExecutionResult, ExecutionSpec, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT
from tests.huge_pages import needs_thp
from tests.jail.conftest import TEST_LIMITS, RunFn


def code(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


@pytest.fixture(autouse=True)
def healthy_after(run: RunFn) -> object:
    """After every hostile program, the same executor still runs a trivial one correctly."""
    yield
    after = run("print('still healthy')")
    assert after.status == Status.OK, after
    assert after.stdout == "still healthy\n"


def test_cpu_spin_times_out(run: RunFn) -> None:
    result = run("while True: pass", timeout_s=1.0)
    assert result.status == Status.TIMEOUT
    assert 0.9 <= result.wall_time < 3.0
    assert result.exit_code is None


def test_sleep_hits_the_wall_clock(run: RunFn) -> None:
    result = run("import time; time.sleep(60)", timeout_s=1.0)
    assert result.status == Status.TIMEOUT
    assert result.cpu_time < 0.5


def test_program_ignoring_signals_and_exceptions_is_still_stopped(run: RunFn) -> None:
    result = run(
        code("""
        import signal, time
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGXCPU):
            signal.signal(s, signal.SIG_IGN)
        while True:
            try:
                time.sleep(10)
            except BaseException:
                pass
        """),
        timeout_s=1.0,
    )
    assert result.status == Status.TIMEOUT


def test_cpu_time_limit_is_enforced_per_process(run: RunFn) -> None:
    result = run("while True: pass", timeout_s=10.0, cpu_time_s=1.0)
    assert result.status == Status.TIMEOUT
    # SIGXCPU, not the wall clock's SIGKILL: the CPU limit stopped it (the wall time depends on
    # the machine's load).
    assert result.signal == signal.SIGXCPU


def test_fork_bomb_stops_at_the_process_limit(run: RunFn) -> None:
    result = run(
        code("""
        import os, time
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                n += 1
        except OSError as e:
            print(n, e.errno)
        """),
        timeout_s=5.0,
        max_processes=20,
    )
    assert result.status == Status.OK, result
    forked, errno = map(int, result.stdout.split())
    assert forked <= 20
    assert errno == 11  # EAGAIN from the pids cgroup


def test_thread_bomb_stops_at_the_process_limit(run: RunFn) -> None:
    result = run(
        code("""
        import threading, time
        threads = []
        try:
            while True:
                t = threading.Thread(target=time.sleep, args=(30,), daemon=True)
                t.start()
                threads.append(t)
        except RuntimeError as e:
            print(len(threads))
        """),
        max_processes=16,
    )
    assert result.status == Status.OK, result
    assert int(result.stdout) <= 16


def test_memory_bomb_is_killed_by_the_cgroup(run: RunFn) -> None:
    result = run("x = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=200)
    assert result.status == Status.MEMORY_LIMIT, result
    assert "allocated" not in result.stdout


def test_memory_bomb_spread_over_children_is_caught(run: RunFn) -> None:
    result = run(
        code("""
        import os, sys, time
        pids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                block = bytearray(90 * 1024 * 1024)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                time.sleep(2)
                os._exit(0)
            pids.append(pid)
        failed = 0
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            failed += os.WIFSIGNALED(status)
        sys.exit(1 if failed else 0)
        """),
        memory_mb=200,
        timeout_s=8.0,
    )
    assert result.status == Status.MEMORY_LIMIT, result


def test_peak_memory_is_reported(run: RunFn) -> None:
    result = run("x = bytearray(100 * 1024 * 1024)\nx[::4096] = b'1' * len(x[::4096])")
    assert result.status == Status.OK, result
    assert result.peak_memory_mb is not None and result.peak_memory_mb >= 100


@pytest.mark.parametrize(
    "program",
    [
        "import sys\nwhile True: sys.stdout.write('y' * 65536)",
        "while True: print('a line of output')",
        "import sys\nsys.stdout.write('z' * (50 * 1024 * 1024))",
    ],
    ids=["no-newlines-forever", "lines-forever", "one-huge-write"],
)
def test_output_flood_is_capped_not_buffered(run: RunFn, program: str) -> None:
    result = run(program, timeout_s=1.5, max_output_bytes=4096)
    assert result.status in (Status.OK, Status.TIMEOUT)
    assert result.stdout_truncated
    assert len(result.stdout.encode()) == 4096


def test_stderr_flood_is_capped_separately(run: RunFn) -> None:
    result = run("import sys\nsys.stderr.write('e' * 100000)\nprint('fine')")
    assert result.status == Status.OK
    assert result.stdout == "fine\n" and not result.stdout_truncated
    assert result.stderr_truncated and len(result.stderr) == 4096


def test_invalid_utf8_is_replaced(run: RunFn) -> None:
    result = run("import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end')")
    assert result.status == Status.OK
    assert result.stdout == "ok \ufffd\ufffd end"


def test_disk_fill_fails_inside_the_program(run: RunFn) -> None:
    result = run(
        code("""
        chunk = b'x' * (1 << 20)
        with open('big', 'wb') as f:
            while True:
                f.write(chunk)
        """),
        max_file_size_mb=16,
    )
    assert result.status == Status.ERROR
    assert "File too large" in result.stderr or "No space left" in result.stderr


def test_inode_fill_fails_and_is_wiped(run: RunFn) -> None:
    result = run(
        code("""
        import os
        n = 0
        try:
            while True:
                open(f'/tmp/f{n}', 'w').close()
                n += 1
        except OSError as e:
            print(n, e.errno)
        """),
        timeout_s=20.0,
    )
    assert result.status == Status.OK, result
    assert int(result.stdout.split()[1]) == 28  # ENOSPC: out of inodes
    after = run("import os; print(len(os.listdir('/tmp')))")
    assert after.stdout == "0\n"


def test_fd_exhaustion_stops_at_the_limit(run: RunFn) -> None:
    result = run(
        code("""
        fs = []
        try:
            while True:
                fs.append(open('/dev/null'))
        except OSError as e:
            print(len(fs), e.errno)
        """),
        max_open_files=64,
    )
    count, errno = map(int, result.stdout.split())
    assert count < 64 and errno == 24  # EMFILE


def test_loopback_services_of_the_host_are_unreachable(run: RunFn) -> None:
    result = run(
        code("""
        import socket
        s = socket.socket()
        s.settimeout(2)
        try:
            s.connect(('127.0.0.1', 6379))
            print('connected')
        except OSError as e:
            print('refused', type(e).__name__)
        print(sorted(name for _, name in socket.if_nameindex()))
        """)
    )
    assert result.status == Status.OK
    assert result.stdout.splitlines() == ["refused ConnectionRefusedError", "['lo']"]


def test_environment_is_minimal_and_fixed(run: RunFn, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run("import os\nfor k in sorted(os.environ): print(k)")
    names = set(result.stdout.split())
    assert names <= {
        "PATH",
        "HOME",
        "TMPDIR",
        "LANG",
        "LC_ALL",
        "USER",
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "MPLBACKEND",
        "PYTHONHASHSEED",
    }
    assert "REDIS_URL" not in names


def test_proc_shows_only_the_jail(run: RunFn) -> None:
    result = run(
        code("""
        import os
        pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
        print(pids)
        print(os.getpid())
        try:
            open('/proc/1/environ').read()
            print('zygote environ readable')
        except (PermissionError, FileNotFoundError):
            print('denied')
        """)
    )
    lines = result.stdout.splitlines()
    # The program's own processes only: the zygote (PID 1) is another uid's, hidden.
    assert eval(lines[0]) == [int(lines[1])], lines
    assert lines[2] == "denied"


def test_host_files_are_not_visible(run: RunFn) -> None:
    result = run(
        code("""
        import os
        for path in ['/etc/shadow', '/etc/hostname', '/root/.bashrc', '/var/log', '/home/root',
                     '/sys/fs/cgroup', '/run']:
            print(path, os.path.exists(path))
        print(os.getuid(), os.getgid())
        """)
    )
    lines = result.stdout.splitlines()
    assert all(line.endswith("False") for line in lines[:-1]), lines
    assert lines[-1] == "1000 1000"


def test_runtime_is_read_only(run: RunFn) -> None:
    result = run(
        code("""
        import os, sys, sympy
        for path in [sys.executable, sympy.__file__, '/usr/bin/newfile', '/etc/passwd']:
            try:
                open(path, 'ab').close()
                print(path, 'writable')
            except OSError as e:
                print(path, 'denied', e.errno)
        """)
    )
    assert "writable" not in result.stdout, result.stdout
    assert result.stdout.count("denied") == 4


def test_ptrace_is_refused_with_an_errno(run: RunFn) -> None:
    result = run(
        code("""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())
        """)
    )
    assert (result.status, result.stdout) == (Status.OK, "-1 1\n"), result  # EPERM


def test_namespace_and_mount_calls_are_refused_with_an_errno(run: RunFn) -> None:
    result = run(
        code("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        for flag in (os.CLONE_NEWUSER, os.CLONE_NEWNS, os.CLONE_NEWNET):
            try:
                os.unshare(flag)
                print("escaped")
            except PermissionError as e:
                print(e.errno)
        print(libc.mount(b"x", b"/tmp", b"tmpfs", 0, 0), ctypes.get_errno())
        """)
    )
    assert result.status == Status.OK, result
    assert result.stdout == "1\n1\n1\n-1 1\n", result


def test_setuid_is_refused(run: RunFn) -> None:
    result = run(
        code("""
        import os
        try:
            os.setuid(0)
        except OSError as e:
            print(e.errno)
        print(os.getuid())
        """)
    )
    assert result.status == Status.OK
    errno, uid = result.stdout.split()
    assert errno in ("1", "22") and uid == "1000"  # EPERM, or EINVAL: uid 0 is not even mapped


def test_killing_the_zygote_and_everyone(run: RunFn) -> None:
    result = run(
        code("""
        import os, signal
        for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGSTOP, 0):
            try:
                os.kill(1, sig)  # the zygote is another uid's: the kernel refuses
                print('signalled the zygote', sig)
            except PermissionError:
                pass
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            print('nobody else to kill')
        print('alive')
        """)
    )
    assert result.status == Status.OK
    assert result.stdout == "nobody else to kill\nalive\n"


def test_the_preloaded_heap_is_immortal_and_the_programs_objects_are_not(
    warm_executor: JailExecutor,
) -> None:
    # Immortal preloaded objects spare the children copy-on-write faults (inside/heap.py).
    result = warm_executor.run(
        ExecutionSpec(
            code=textwrap.dedent("""\
            import sys, sympy
            mine = object()
            print(sys.getrefcount(sympy.solve) == 0xFFFFFFFF, sys.getrefcount(mine))
            """)
        )
    )
    assert (result.status, result.stdout) == (Status.OK, "True 2\n")


@needs_thp
def test_the_preloaded_heap_is_on_huge_pages_and_a_programs_writes_stay_its_own(
    warm_executor: JailExecutor,
) -> None:
    # Huge pages spare fork and exit most of their page-table work (zygote.huge_pages); a
    # program that writes straight into a preloaded object's memory must still write only its
    # own copy, never the zygote's page that the next run is forked from.
    pid = warm_executor.zygote_pid()
    with open(f"/proc/{pid}/smaps_rollup") as f:
        huge_kib = int(f.read().split("AnonHugePages:")[1].split()[0])
    assert huge_kib >= 2048
    overwrite = textwrap.dedent("""\
        import ctypes, sys, sympy
        v = sympy.__version__
        ctypes.memset(id(v) + sys.getsizeof(v) - len(v) - 1, ord('X'), len(v))
        print(sympy.__version__)
        """)
    written = warm_executor.run(ExecutionSpec(code=overwrite))
    after = warm_executor.run(ExecutionSpec(code="import sympy; print(sympy.__version__)"))
    assert written.status == after.status == Status.OK
    assert set(written.stdout.strip()) == {"X"}
    assert after.stdout.strip() == sympy_version() and "X" not in after.stdout


def smaps(pid: int) -> list[tuple[list[str], dict[str, int]]]:
    """Each mapping of the process: its /proc/PID/maps fields and its counters in kB."""
    mappings: list[tuple[list[str], dict[str, int]]] = []
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and fields[0].endswith(":"):
                if fields[1].isdigit():
                    mappings[-1][1][fields[0][:-1]] = int(fields[1])
            elif fields:
                mappings.append((fields, {}))
    return mappings


def test_the_preloaded_heap_lies_in_the_heap_mapping(warm_executor: JailExecutor) -> None:
    # Arenas mapped one by one land between the libraries' mappings, where no huge page can
    # back them, and every fork copies a page-table entry per page of them
    # (zygote.contiguous_arenas): most of the zygote's memory must be in its heap's mapping.
    mappings = smaps(warm_executor.zygote_pid() or 0)
    anonymous_kib = sum(kib["Anonymous"] for _, kib in mappings)
    heap_kib = sum(kib["Anonymous"] for fields, kib in mappings if fields[-1] == "[heap]")
    assert heap_kib > 0.6 * anonymous_kib, f"{heap_kib} of {anonymous_kib} KiB in the heap"


@needs_thp
def test_the_interpreters_code_lies_on_huge_pages_of_the_zygote(
    warm_executor: JailExecutor,
) -> None:
    # A file's code is faulted in again by every forked child; an anonymous copy on huge pages
    # is inherited whole (zygote.interpreter_code_on_huge_pages).
    mappings = smaps(warm_executor.zygote_pid() or 0)
    code_kib = sum(
        kib["AnonHugePages"]
        for fields, kib in mappings
        if len(fields) == 5 and fields[1] == "r-xp"  # anonymous, executable
    )
    assert code_kib >= 2048


REWRITE_CODE = """\
import ctypes
libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
address = ctypes.cast(ctypes.pythonapi.PyOS_AfterFork, ctypes.c_void_p).value  # never called
print(ctypes.string_at(address, 16).hex())
if {rewrite}:
    page = address & ~0xFFF
    assert libc.mprotect(page, 8192, 7) == 0
    ctypes.memset(address, 0xCC, 16)
    print(ctypes.string_at(address, 16).hex())
"""


def test_a_program_that_rewrites_the_interpreters_code_rewrites_only_its_own_copy(
    warm_executor: JailExecutor,
) -> None:
    # The interpreter's code is memory the zygote shares with every child it forks: a program
    # that makes it writable and overwrites it must change its own copy, never the next run's.
    first = warm_executor.run(ExecutionSpec(code=REWRITE_CODE.format(rewrite=True)))
    second = warm_executor.run(ExecutionSpec(code=REWRITE_CODE.format(rewrite=False)))
    assert (first.status, second.status) == (Status.OK, Status.OK), (first, second)
    original, rewritten = first.stdout.split()
    assert rewritten == "cc" * 16 != original
    assert second.stdout.split() == [original]


def test_a_program_that_unmaps_the_interpreters_code_ends_alone(
    warm_executor: JailExecutor,
) -> None:
    # Pulling the code out from under the interpreter kills the program's process at its next
    # instruction; the zygote's mapping, which every later run is forked from, stays whole.
    before = warm_executor.zygote_pid()
    unmap = textwrap.dedent("""\
        import ctypes
        libc = ctypes.CDLL(None)
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        address = ctypes.cast(ctypes.pythonapi.PyObject_Repr, ctypes.c_void_p).value
        libc.munmap(address & ~0x1FFFFF, 2 << 20)
        print("still here")
        """)
    crashed = warm_executor.run(ExecutionSpec(code=unmap))
    after = warm_executor.run(ExecutionSpec(code="print(repr('fine'))"))
    assert (crashed.status, crashed.signal, crashed.stdout) == (Status.KILLED, 11, ""), crashed
    assert (after.status, after.stdout) == (Status.OK, "'fine'\n")
    assert warm_executor.zygote_pid() == before


def sympy_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("sympy")


def test_zygote_survives_hostile_programs(warm_executor: JailExecutor) -> None:
    before = warm_executor.zygote_pid()
    assert before is not None
    attacks = [
        "import os, signal\nos.kill(1, signal.SIGKILL)\nos.kill(1, signal.SIGSTOP)",
        "import ctypes\nctypes.CDLL(None).ptrace(16, 1, 0, 0)",
        "import resource\nresource.prlimit(1, resource.RLIMIT_CPU, (1, 1))",
        "open('/proc/1/oom_score_adj', 'w').write('1000')",
        "open('/proc/1/mem', 'rb').read(1)",
    ]
    statuses = [warm_executor.run(ExecutionSpec(code=attack)).status for attack in attacks]
    # The zygote is another uid's: a signal to it raises PermissionError; ptrace answers EPERM
    # (ctypes returns -1); prlimit of another process raises PermissionError; /proc/1 is
    # hidden from the program.
    assert statuses == [Status.ERROR, Status.OK, Status.ERROR, Status.ERROR, Status.ERROR]
    after = warm_executor.run(ExecutionSpec(code="print('zygote fine')"))
    assert after.stdout == "zygote fine\n"
    assert warm_executor.zygote_pid() == before


def test_daemons_do_not_outlive_the_call(run: RunFn) -> None:
    result = run(
        code("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(0.5)
                open('/tmp/daemon-was-here', 'w').write('x')
                time.sleep(60)
            os._exit(0)
        print('parent done')
        """)
    )
    assert result.status == Status.OK
    check = run(
        code("""
        import os, time
        time.sleep(1)
        print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [os.getpid()])
        print(os.path.exists('/tmp/daemon-was-here'))
        """)
    )
    alone, exists = check.stdout.splitlines()
    assert alone == "True"
    assert exists == "False"


def test_input_files_are_importable_and_each_run_sees_its_own(run: RunFn) -> None:
    program = "import helper\nfrom pkg import inner\nprint(helper.VALUE, inner.NAME)"
    answers = []
    for value in (1, 2):
        files = {
            "helper.py": f"VALUE = {value}".encode(),
            "pkg/__init__.py": b"",
            "pkg/inner.py": f"NAME = 'run{value}'".encode(),
        }
        result = run(program, files=files)
        assert result.status == Status.OK, result
        answers.append(result.stdout)
    assert answers == ["1 run1\n", "2 run2\n"]


def test_nothing_leaks_between_executions(run: RunFn) -> None:
    first = run(
        code("""
        import builtins, json, os, sys, types
        builtins.LEAK = 1
        json.LEAK = 1
        sys.modules['leaked_module'] = types.ModuleType('leaked_module')
        os.environ['LEAKED'] = '1'
        GLOBAL_LEAK = 1
        open('workfile.txt', 'w').write('x')
        open('/tmp/tmpfile.txt', 'w').write('x')
        open('/dev/shm/shmfile', 'w').write('x')
        with open('mymod.py', 'w') as f:
            f.write('VALUE = 1')
        import mymod
        """)
    )
    assert first.status == Status.OK, first
    second = run(
        code("""
        import builtins, json, os, sys
        print(hasattr(builtins, 'LEAK'), hasattr(json, 'LEAK'), 'leaked_module' in sys.modules,
              'LEAKED' in os.environ, 'GLOBAL_LEAK' in globals(), 'mymod' in sys.modules)
        print(os.listdir('.'), os.listdir('/tmp'), os.listdir('/dev/shm'))
        """)
    )
    assert second.stdout.splitlines() == [
        "False False False False False False",
        "[] [] []",
    ]


def test_random_state_differs_between_executions(run: RunFn) -> None:
    # numpy's legacy state also caches the second of each pair of Gaussians it draws.
    program = (
        "import random, numpy, sympy.core.random\n"
        "print(random.random(), numpy.random.random(), numpy.random.standard_normal(),"
        " sympy.core.random.rng.random())"
    )
    first, second = run(program), run(program)
    assert first.status == second.status == Status.OK
    for generator, a, b in zip(
        ("random", "numpy", "numpy's Gaussian", "sympy"),
        first.stdout.split(),
        second.stdout.split(),
        strict=True,
    ):
        assert a != b, f"{generator} drew the same number in two executions"


def test_the_interpreter_state_is_the_programs_own_process(run: RunFn) -> None:
    # The zygote forks without os.fork's interpreter handlers (zygote.fork_lean): what those
    # would have reset must still describe this process, and threads, asyncio and logging work.
    program = textwrap.dedent("""\
        import asyncio, logging, os, threading
        main = threading.main_thread()
        assert threading.current_thread() is main
        assert main.native_id == threading.get_native_id() == os.getpid(), (
            main.native_id, threading.get_native_id(), os.getpid())
        done = []
        t = threading.Thread(target=done.append, args=(1,))
        t.start()
        t.join()
        async def answer():
            await asyncio.sleep(0)
            return 42
        logging.basicConfig()
        logging.getLogger("program").warning("logged")
        print(done, asyncio.run(answer()), len(threading.enumerate()))
        """)
    result = run(program)
    assert result.status == Status.OK, result.stderr
    assert result.stdout == "[1] 42 1\n"
    assert "logged" in result.stderr


def test_segfault_is_killed(run: RunFn) -> None:
    result = run("import ctypes\nctypes.string_at(0)")
    assert result.status == Status.KILLED
    assert result.signal == signal.SIGSEGV


def test_deep_recursion_is_an_error(run: RunFn) -> None:
    result = run("def f(n): return f(n + 1)\nf(0)")
    assert result.status == Status.ERROR
    assert "RecursionError" in result.stderr


def test_unbounded_recursion_limit_crashes_cleanly(run: RunFn) -> None:
    result = run(
        "import sys\nsys.setrecursionlimit(10**8)\ndef f(n): return f(n + 1)\nf(0)",
        memory_mb=128,
        timeout_s=30.0,
    )
    # Python frames live on the heap (3.12): the memory limit or the C stack ends it.
    assert result.status in (Status.KILLED, Status.ERROR, Status.MEMORY_LIMIT)


@pytest.mark.parametrize(
    ("program", "status", "exit_code", "stderr_part"),
    [
        ("import sys; sys.exit(0)", Status.OK, 0, ""),
        ("import sys; sys.exit(3)", Status.ERROR, 3, ""),
        ("import os; os._exit(7)", Status.ERROR, 7, ""),
        ("raise SystemExit('bye')", Status.ERROR, 1, "bye"),
        ("raise ValueError('boom')", Status.ERROR, 1, "ValueError: boom"),
        ("def f(:\n  pass", Status.ERROR, 1, "SyntaxError"),
        # An uncaught MemoryError ended it: the limit's status (API.md, outcome.py); printed: error.
        ("[0] * 10**12", Status.MEMORY_LIMIT, 1, "MemoryError"),
        ("import sys; print('MemoryError', file=sys.stderr); sys.exit(1)", Status.ERROR, 1, ""),
    ],
)
def test_exit_codes_and_errors(
    run: RunFn, program: str, status: Status, exit_code: int, stderr_part: str
) -> None:
    result = run(program)
    assert (result.status, result.exit_code) == (status, exit_code), result
    assert stderr_part in result.stderr


def test_stdin_is_fed(run: RunFn) -> None:
    result = run(
        "import sys\nlines = sys.stdin.read().split()\nprint(sum(map(int, lines)))",
        stdin="1 2 3\n4\n",
    )
    assert result.stdout == "10\n"


def test_the_standard_streams_are_what_a_fresh_interpreter_over_pipes_has(run: RunFn) -> None:
    # The streams are made by the zygote once, over a pipe (zygote.make_children_std_streams):
    # made over its own descriptors (a log file), stdout claimed to seek and tell() failed
    # with an OSError instead of io.UnsupportedOperation.
    probe = textwrap.dedent("""\
        import io, sys
        streams = (sys.stdin, sys.stdout, sys.stderr)
        print([s.seekable() for s in streams], [s.isatty() for s in streams])
        print(sys.stdout.line_buffering, sys.stderr.line_buffering, sys.stdout.encoding)
        print(sys.__stdout__ is sys.stdout, sys.stdin.read())
        try:
            sys.stdout.tell()
        except io.UnsupportedOperation:
            print("no tell")
        """)
    result = run(probe, stdin="fed")
    expected = "[False, False, False] [False, False, False]\nFalse True utf-8\nTrue fed\nno tell\n"
    assert (result.status, result.stdout) == (Status.OK, expected), result


def test_huge_unread_stdin_does_not_block(run: RunFn) -> None:
    result = run("print('ignored stdin')", stdin="x" * (8 * 1024 * 1024))
    assert result.status == Status.OK and result.stdout == "ignored stdin\n"


def test_files_in_and_out(run: RunFn) -> None:
    result = run(
        "data = open('in/data.txt').read()\nopen('out.txt', 'w').write(data.upper())",
        files={"in/data.txt": b"hello"},
        fetch_files=("out.txt", "missing.txt"),
    )
    assert result.status == Status.OK, result
    assert result.files == {"out.txt": b"HELLO"}


def test_large_input_files(run: RunFn) -> None:
    # Input files within the API's 16 MiB: the standby's report to the zygote once carried
    # them, base64 again, and a report over its 1 MiB bound ended the jail.
    data = bytes(range(256)) * (12 * 1024)  # 3 MiB
    result = run(
        "import hashlib\nprint(hashlib.sha256(open('big.bin', 'rb').read()).hexdigest())",
        files={"big.bin": data, "small.txt": b"x"},
    )
    assert result.status == Status.OK, result
    assert result.stdout == hashlib.sha256(data).hexdigest() + "\n"


def test_fetch_never_follows_symlinks_out(run: RunFn) -> None:
    result = run(
        "import os\nos.symlink('/etc/passwd', 'link.txt')\nos.symlink('/proc', 'dir')",
        fetch_files=("link.txt", "dir/1/environ"),
    )
    assert result.status == Status.OK
    assert result.files == {}


def test_numpy_and_sympy_work_at_default_limits(run: RunFn) -> None:
    result = run(
        code("""
        import numpy as np
        import sympy as sp
        x = sp.symbols('x')
        print(sp.solve(x**2 - 4*x + 3, x))
        a = np.array([[2.0, 1.0], [1.0, 3.0]])
        print(np.round(np.linalg.solve(a, [3.0, 5.0]), 6).tolist())
        """),
        memory_mb=1024,
        max_processes=64,
    )
    assert result.status == Status.OK, result
    assert result.stdout.splitlines() == ["[1, 3]", "[0.8, 1.4]"]


def _status_summary(result: ExecutionResult) -> tuple[str, int | None, int | None, str]:
    return (result.status.value, result.exit_code, result.signal, result.stdout)


def test_warm_zygote_is_recycled_without_a_gap() -> None:
    settings = Settings(cgroup_parent=JAIL_CGROUP_PARENT, zygote_max_runs=3)
    executor = JailExecutor(settings, slot=10, mode="warm")
    try:
        zygotes: list[int | None] = []
        deadline = time.monotonic() + 90
        i = 0
        # The replacement zygote preloads in the background while the old one keeps serving,
        # so executions never wait for a preload; it takes over once it is ready.
        while len(set(zygotes)) < 3 and time.monotonic() < deadline:
            result = executor.run(ExecutionSpec(code=f"print({i})"))
            assert (result.status, result.stdout) == (Status.OK, f"{i}\n")
            zygotes.append(executor.zygote_pid())
            i += 1
            time.sleep(0.1)
        assert len(set(zygotes)) >= 3
    finally:
        executor.close()
    assert not any(cgroups.pids() for cgroups in executor._cgroups)


# --- issue 12: nothing survives a run, the machinery is out of reach ---------------------------


def test_sysv_ipc_and_posix_message_queues_are_refused_with_an_errno(run: RunFn) -> None:
    result = run(
        code("""
        import ctypes, ctypes.util
        libc = ctypes.CDLL(None, use_errno=True)
        rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
        IPC_CREAT = 0o1000
        calls = {
            "msgget": lambda: libc.msgget(0, IPC_CREAT | 0o600),
            "shmget": lambda: libc.shmget(0, 4096, IPC_CREAT | 0o600),
            "semget": lambda: libc.semget(0, 1, IPC_CREAT | 0o600),
            "mq_open": lambda: rt.mq_open(b"/rl-q", 0o100 | 2, 0o600, None),
        }
        for name, call in calls.items():
            ctypes.set_errno(0)
            print(name, call(), ctypes.get_errno())
        """)
    )
    assert result.status == Status.OK, result
    for name in ("msgget", "shmget", "semget", "mq_open"):
        assert f"{name} -1 38\n" in result.stdout, result.stdout  # ENOSYS, and no object


def test_posix_shared_memory_and_files_do_not_survive_the_run(run: RunFn) -> None:
    planted = run(
        code("""
        from multiprocessing import shared_memory
        import os
        shm = shared_memory.SharedMemory(name="rl-leak", create=True, size=1 << 20)
        shm.buf[:6] = b"secret"
        shm.close()  # not unlinked: it stays in /dev/shm
        for path in ("/tmp/leak", "/home/sandbox/leak", "/dev/shm/leak"):
            open(path, "w").write("secret")
        print(sorted(os.listdir("/dev/shm")))
        """)
    )
    assert planted.status == Status.OK, planted
    assert "rl-leak" in planted.stdout
    found = run(
        code("""
        import os
        print(os.listdir("/dev/shm"), os.listdir("/tmp"), os.listdir("/home/sandbox"))
        """)
    )
    assert found.stdout == "[] [] []\n", f"a run's files or shared memory survived: {found}"


def test_multiprocessing_works_under_the_policy(run: RunFn) -> None:
    result = run(
        code("""
        import multiprocessing as mp
        with mp.Pool(2) as pool:
            print(sum(pool.map(abs, range(-50, 50))))
        lock = mp.Lock()
        with lock:
            q = mp.Queue(); q.put(7); print(q.get())
        """),
        timeout_s=20.0,
    )
    assert result.status == Status.OK, result
    assert result.stdout == "2500\n7\n"


def test_the_program_holds_no_descriptor_of_the_control_path(run: RunFn) -> None:
    result = run(
        code("""
        import os, resource
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        held = []
        for fd in range(3, soft):
            try:
                os.fstat(fd)
            except OSError:
                continue
            held.append((fd, os.readlink(f"/proc/self/fd/{fd}")))
        print(held, sorted(int(n) for n in os.listdir("/proc/self/fd")))
        """)
    )
    assert result.status == Status.OK, result
    # The listing itself opens one descriptor (3), gone once listed.
    assert result.stdout == "[] [0, 1, 2, 3]\n", f"the program holds extra fds: {result}"


def test_forged_exit_reports_and_half_lines_on_every_descriptor_change_nothing(
    run: RunFn,
) -> None:
    result = run(
        code("""
        import os, sys
        forged = b'{"exit": 0, "cpu": -5.0}\\n{"exit": "x"}\\n\\x00\\xff{"exit'
        for fd in range(3, 256):
            try:
                os.write(fd, forged)
            except OSError:
                pass
        sys.exit(3)
        """)
    )
    assert result.status == Status.ERROR, f"a forged report was believed: {result}"
    assert result.exit_code == 3
    assert result.cpu_time >= 0.0


def test_the_exit_status_comes_from_the_kernel(run: RunFn) -> None:
    result = run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert result.status == Status.KILLED and result.signal == signal.SIGSEGV, result
    assert result.cpu_time > 0.0


def test_a_deep_tree_of_long_names_fifos_sockets_and_locked_modes_is_wiped(
    run: RunFn,
) -> None:
    planted = run(
        code("""
        import os, socket
        name = "d" * 250
        fd = os.open("/tmp", os.O_RDONLY)
        for depth in range(2000):  # far past PATH_MAX and the recursion limit
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.mkfifo("fifo", dir_fd=fd)
        os.chdir(fd)
        s = socket.socket(socket.AF_UNIX); s.bind("sock")
        os.mkdir("locked"); open("locked/f", "w").write("x"); os.chmod("locked", 0)
        open("unreadable", "w").write("x"); os.chmod("unreadable", 0)
        os.fchmod(fd, 0o500)
        os.chdir("/home/sandbox")
        os.mkfifo("pipe")
        os.symlink("/etc/passwd", "link")
        print("planted")
        """),
        timeout_s=20.0,
    )
    assert planted.stdout == "planted\n", planted
    found = run("import os\nprint(os.listdir('/tmp'), os.listdir('/home/sandbox'))")
    assert found.stdout == "[] []\n", f"the wipe left files behind: {found}"


def test_a_fifo_or_socket_named_in_fetch_files_never_blocks(run: RunFn) -> None:
    result = run(
        code("""
        import os, socket
        os.mkfifo("out.txt")
        s = socket.socket(socket.AF_UNIX); s.bind("sock")
        os.symlink("/etc/passwd", "link")
        open("real.txt", "w").write("real")
        """),
        fetch_files=("out.txt", "sock", "link", "real.txt", "absent"),
    )
    assert result.status == Status.OK, result
    assert result.files == {"real.txt": b"real"}
    assert "out.txt: not a regular file" in result.stderr


def test_fetch_budget_returns_what_fits_and_names_the_rest(run: RunFn) -> None:
    result = run(
        code("""
        for i in range(3):
            open(f"big{i}.bin", "wb").write(bytes([i]) * (7 << 20))
        for i in range(70):
            open(f"small{i}.txt", "w").write(str(i))
        """),
        fetch_files=("big0.bin", "big1.bin", "big2.bin", *(f"small{i}.txt" for i in range(70))),
        timeout_s=20.0,
    )
    assert result.status == Status.OK, result
    assert sum(len(v) for v in result.files.values()) <= 16 << 20
    assert "big0.bin" in result.files and "big1.bin" in result.files
    assert "big2.bin" not in result.files
    assert len(result.files) == 64  # max_fetch_files
    assert "fetch_files not returned" in result.stderr
    assert "big2.bin: over the fetch budget" in result.stderr


def test_proc_shows_only_the_jails_own_processes(run: RunFn) -> None:
    result = run(
        code("""
        import os
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        print(pids == [os.getpid()], os.path.exists("/proc/1"))
        for name in ("meminfo", "loadavg", "cpuinfo", "mounts", "sysvipc", "kallsyms"):
            print(name, os.path.exists("/proc/" + name))
        """)
    )
    assert result.status == Status.OK, result
    lines = result.stdout.splitlines()
    # Its own processes only: the zygote (PID 1) is another uid's, hidden (hidepid).
    assert lines[0] == "True False", f"/proc shows other processes: {result.stdout}"
    assert all(line.endswith("False") for line in lines[1:]), f"host-wide /proc: {lines}"


def test_memory_a_run_leaves_charged_is_released_or_the_jail_replaced(
    run: RunFn, executor: JailExecutor
) -> None:
    result = run(
        code("""
        open("/dev/shm/fill", "wb").write(b"x" * (60 << 20))
        for i in range(4):  # 200 MiB in files under the 64 MiB file-size limit
            open(f"/tmp/fill{i}", "wb").write(b"x" * (50 << 20))
        import mmap
        m = mmap.mmap(-1, 100 << 20, flags=mmap.MAP_SHARED); m.write(b"y" * (100 << 20))
        if __import__("os").fork() == 0:
            __import__("time").sleep(60)  # a child holding the shared mapping
        """),
        memory_mb=512,
        timeout_s=20.0,
    )
    assert result.status == Status.OK, result
    run("pass")
    above = executor.memory_above_baseline_mb()
    if executor.mode == "cold":
        assert above is None, "a cold jail outlived its run"
        return
    assert above is not None
    assert above <= Settings().memory_recycle_slack_mb, f"{above} MiB stayed charged"


def test_cpu_limit_holds_32_spinners_to_the_slots_share(run: RunFn, executor: JailExecutor) -> None:
    for cgroups in executor._cgroups:
        if cgroups.v2:
            limit = (cgroups.dirs["unified"] / "cpu.max").read_text().split()[0]
        else:
            limit = (cgroups.dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip()
        assert limit == "100000", f"the slot has no one-core CPU limit: {limit}"
    before = executor.cpu_throttling()
    result = run(
        code("""
        import os, signal, time
        started = time.monotonic()
        pids = []
        for _ in range(32):
            pid = os.fork()
            if pid == 0:
                os.nice(19)  # the parent, sharing the slot's one core, must still get to stop them
                while True:
                    pass
            pids.append(pid)
        time.sleep(2)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        spent = 0.0
        for pid in pids:
            _, _, usage = os.wait4(pid, 0)
            spent += usage.ru_utime + usage.ru_stime
        print(f"{spent:.3f} {time.monotonic() - started:.3f}")
        """),
        max_processes=64,
        timeout_s=30.0,
    )
    assert result.status == Status.OK, result
    after = executor.cpu_throttling()
    spent_s, wall_s = map(float, result.stdout.split())
    # The kernel's own accounting of the spinners: one core's quota over the wall time, with a
    # period (100 ms) of slack. On an idle host of two or more cores they would have had more.
    print(f"32 spinners: {spent_s:.2f} s CPU in {wall_s:.2f} s wall; {before} -> {after}")
    assert spent_s <= wall_s + 0.15, f"the spinners took more than one core: {result.stdout}"
    if spent_s >= 0.9 * wall_s:  # they reached the quota (the host was not saturated by others)
        assert after.throttled_periods > before.throttled_periods, "the slot was never throttled"


LEAVE_LOOPBACK_STATE = """
import socket
server = socket.create_server(('127.0.0.1', 47123))
client = socket.create_connection(('127.0.0.1', 47123))
accepted, _ = server.accept()
client.sendall(b'x' * 5000)
accepted.recv(10000)
accepted.close()  # this side closes first: its port waits in TIME_WAIT for a minute
client.close()
server.close()
"""
SEE_LOOPBACK_STATE = """
import socket
sockets = [line for name in ('tcp', 'tcp6', 'udp', 'udp6')
           for line in open(f'/proc/self/net/{name}').read().splitlines()[1:]]
lo = [line.split(':')[1].split() for line in open('/proc/self/net/dev')
      if line.strip().startswith('lo:')]
try:
    socket.create_server(('127.0.0.1', 47123)).close()
    bound = 'bound'
except OSError as exc:
    bound = exc.strerror
print(len(sockets), int(lo[0][1]) + int(lo[0][9]), bound)
"""


def test_a_run_sees_nothing_of_an_earlier_runs_loopback(run: RunFn) -> None:
    # Issue 35 (round 3, warm mode): the next run, possibly another tenant's, saw the earlier
    # run's sockets, found its port taken for a minute and read its byte counts.
    assert run(LEAVE_LOOPBACK_STATE).status is Status.OK
    assert run(SEE_LOOPBACK_STATE).stdout == "0 0 bound\n"
    assert run(LEAVE_LOOPBACK_STATE).status is Status.OK  # the fresh loopback serves
    # A run that never touches the network keeps the namespace: nothing to renew.
    assert run("print(1)").stdout == "1\n"
    assert run(SEE_LOOPBACK_STATE).stdout == "0 0 bound\n"


def test_the_zygote_cgroup_has_a_hard_memory_limit_above_what_it_holds(
    warm_executor: JailExecutor,
) -> None:
    """The machinery's own memory is bounded (docs/security.md, the resource ledger): whatever a
    program makes the zygote hold ends that jail, never the host."""
    assert warm_executor.run(ExecutionSpec(code="print(1)", limits=TEST_LIMITS)).stdout == "1\n"
    held = [c for c in warm_executor._cgroups if c.zygote_memory_bytes() > 0]
    assert held, "no slot cgroup holds the zygote"
    for cgroups in held:
        limit = cgroups.zygote_memory_limit_bytes()
        assert limit is not None, "the zygote cgroup has no memory limit"
        assert cgroups.zygote_memory_bytes() < limit < 2 << 30
