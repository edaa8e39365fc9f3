"""Isolation by construction (issue 27), in warm and cold mode: the program is another principal
than the jail's machinery, every run starts from fresh scratch roots, the zygote is outside the
run's OOM domain, nothing the program writes decides its status, and no request ends the jail.
Each test fails when its attack works; every test leaves the executor healthy.
"""

from __future__ import annotations

import base64
import json
import signal
import struct
import textwrap
import time
from collections.abc import Iterator

import pytest

from sandbox_service.execution import ExecutionSpec, RecordedCell, Status
from sandbox_service.jail import JailExecutor
from sandbox_service.jail.inside.outputs import OUTPUTS_FILE
from sandbox_service.jail.sessions import SessionPool
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT
from tests.jail.conftest import RunFn

PNG_1X1 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)
ROOTS = ("/home/sandbox", "/tmp", "/mnt", "/dev/shm")


def code(text: str) -> str:
    return textwrap.dedent(text).strip() + "\n"


@pytest.fixture(autouse=True)
def healthy_after(run: RunFn) -> Iterator[None]:
    yield
    after = run("print('still healthy')")
    assert (after.status, after.stdout) == (Status.OK, "still healthy\n"), after


# --- two principals ---------------------------------------------------------------------------


def test_the_zygote_is_another_principal_the_kernel_protects(run: RunFn) -> None:
    result = run(
        code("""
        import os
        print(os.getresuid(), os.getresgid(), os.getgroups())
        caps = {l.split(':')[0]: int(l.split()[1], 16) for l in open('/proc/self/status')
                if l.startswith('Cap')}
        print('caps', caps['CapEff'], caps['CapPrm'], caps['CapAmb'])
        attempts = {
            'renice': lambda: os.setpriority(os.PRIO_PROCESS, 1, 7),
            'affinity': lambda: os.sched_setaffinity(1, {0}),
            'signal': lambda: os.kill(1, 0),
            'proc1': lambda: open('/proc/1/status').read(),
            'setuid0': lambda: os.setresuid(0, 0, 0),
            'setgroups': lambda: os.setgroups([0]),
        }
        for parent in ('/', '/home', '/dev'):
            attempts['chmod ' + parent] = lambda p=parent: os.chmod(p, 0o777)
            attempts['xattr ' + parent] = lambda p=parent: os.setxattr(p, 'user.x', b'1')
        for root in ('/tmp', '/mnt', '/dev/shm'):
            attempts['chmod ' + root] = lambda p=root: os.chmod(p, 0o700)
            attempts['xattr ' + root] = lambda p=root: os.setxattr(p, 'user.x', b'1')
            attempts['utime ' + root] = lambda p=root: os.utime(p, (0, 0))
        for name, attempt in attempts.items():
            try:
                attempt()
                print(name, 'ALLOWED')
            except OSError:
                pass
        """)
    )
    assert result.status == Status.OK, result
    lines = result.stdout.splitlines()
    assert lines[:2] == ["(1000, 1000, 1000) (1000, 1000, 1000) []", "caps 0 0 0"], lines
    assert lines[2:] == [], f"allowed on the jail's machinery: {lines[2:]}"


def test_renicing_and_pinning_do_not_reach_the_next_run(run: RunFn) -> None:
    probe = "import os; print(os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)))"
    before = run(probe)
    attack = run(
        code("""
        import os
        for call in (lambda: os.setpriority(os.PRIO_PROCESS, 1, 19),
                     lambda: os.setpriority(os.PRIO_PGRP, 1, 19),
                     lambda: os.setpriority(os.PRIO_USER, 0, 19),
                     lambda: os.sched_setaffinity(1, {0}),
                     lambda: os.sched_setaffinity(0, {0}),
                     lambda: os.nice(19)):
            try:
                call()
            except OSError:
                pass
        """)
    )
    assert attack.status == Status.OK, attack
    after = run(probe)
    assert after.stdout == before.stdout, (before.stdout, after.stdout)


# --- fresh scratch roots --------------------------------------------------------------------------


def _deny_all_default_acl() -> bytes:
    # system.posix_acl_default: version 2, then (tag, perm, id): user::---, group::---, other::---
    return struct.pack("<I", 2) + b"".join(
        struct.pack("<HHI", tag, 0, 0xFFFFFFFF) for tag in (0x01, 0x04, 0x20)
    )


def test_nothing_set_on_the_scratch_roots_reaches_the_next_run(run: RunFn) -> None:
    acl = _deny_all_default_acl()
    attack = run(
        code(f"""
        import os
        for root in {ROOTS!r}:
            for set_it in (lambda: os.setxattr(root, 'system.posix_acl_default', {acl!r}),
                           lambda: os.setxattr(root, 'user.mark', b'left'),
                           lambda: os.utime(root, (0, 0)),
                           lambda: os.chmod(root, 0o700)):
                try:
                    set_it()
                except OSError:
                    pass
            try:
                os.makedirs(root + '/.config/left', exist_ok=True)
                os.setxattr(root + '/.config', 'user.mark', b'left')
            except OSError:
                pass
        """)
    )
    assert attack.status == Status.OK, attack
    check = run(
        code(f"""
        import os, stat
        for root in {ROOTS!r}:
            info = os.stat(root)
            print(root, os.listxattr(root), os.listdir(root), oct(stat.S_IMODE(info.st_mode)),
                  info.st_mtime > 1e9)
        import matplotlib.pyplot as plt
        plt.plot([0, 1])
        plt.savefig('/tmp/plot.png')
        print('matplotlib works', os.path.getsize('/tmp/plot.png') > 0)
        """)
    )
    assert check.status == Status.OK, check
    assert check.stdout.splitlines() == [
        "/home/sandbox [] [] 0o755 True",
        "/tmp [] [] 0o1777 True",
        "/mnt [] [] 0o1777 True",
        "/dev/shm [] [] 0o1777 True",
        "matplotlib works True",
    ], check.stdout


def test_the_first_runs_scratch_files_are_freed_with_its_mount() -> None:
    # Nothing may keep a detached scratch tmpfs alive (the zygote's own working directory was
    # the first run's /home/sandbox): its files would stay charged, and the jail be replaced.
    executor = JailExecutor(Settings(cgroup_parent=JAIL_CGROUP_PARENT), slot=11, mode="warm")
    try:
        fill = "for name in 'ab': open(name, 'wb').write(b'x' * (48 << 20))"
        assert executor.run(ExecutionSpec(code=fill)).status == Status.OK
        # The zygote mounts the next run's directories after its answer: give it that moment
        # (the executor reads the memory left charged when the next run comes).
        time.sleep(1.0)
        assert executor.run(ExecutionSpec(code="print(1)")).stdout == "1\n"
        assert executor.memory_recycles == 0
        left = executor.memory_above_baseline_mb()
        assert left is not None and left < 32, f"{left} MiB still charged"
    finally:
        executor.close()


# --- the OOM domain -------------------------------------------------------------------------------


def test_an_oom_kill_is_the_runs_memory_limit_and_never_the_zygotes(
    run: RunFn, executor: JailExecutor
) -> None:
    zygote = executor.zygote_pid()
    # The attack: the program lowers its own OOM score, then an exec'd process fills
    # /tmp (tmpfs pages charged to the run, held by no process's resident memory). Files of
    # 16 MiB each: one file filled to the 64 MiB file-size bound would end on EFBIG instead,
    # before the memory limit, whenever the interpreter's own pages leave room for it.
    result = run(
        code("""
        import os, sys
        open('/proc/self/oom_score_adj', 'w').write('0')
        fill = ("import itertools\\n"
                "for i in itertools.count():\\n"
                "    with open(f'/tmp/fill{i}', 'wb') as f:\\n"
                "        for _ in range(16): f.write(b'x' * (1 << 20))\\n")
        os.execv(sys.executable, [sys.executable, '-c', fill])
        """),
        memory_mb=64,
        timeout_s=20.0,
    )
    assert result.status == Status.MEMORY_LIMIT, (result, result.stderr)
    if executor.mode == "warm":
        assert executor.zygote_pid() == zygote, "the jail was replaced"


# --- nothing the program writes decides -----------------------------------------------------------


def test_a_forged_outputs_file_passes_only_valid_pngs(run: RunFn) -> None:
    forged = {
        "display": [
            {"image/png": "not base64 at all!"},
            {"image/png": base64.b64encode(b"GIF89a not a png").decode()},
            {"image/png": PNG_1X1},
            {"text/plain": "fine", "application/x-evil": "dropped"},
            "not an object",
        ],
        "error": {"ename": 7},
    }
    result = run(f"open({OUTPUTS_FILE!r}, 'w').write({json.dumps(forged)!r})")
    assert result.status == Status.OK, result
    assert result.display == ({"image/png": PNG_1X1}, {"text/plain": "fine"}), result.display
    assert result.error is None
    assert "rich outputs dropped" in result.stderr
    assert "not strict base64" in result.stderr and "no PNG signature" in result.stderr


def test_a_self_sent_sigxcpu_is_not_a_timeout(run: RunFn) -> None:
    result = run("import os, signal; os.kill(os.getpid(), signal.SIGXCPU)", timeout_s=5.0)
    assert (result.status, result.signal) == (Status.KILLED, signal.SIGXCPU), result


def test_a_printed_memory_error_is_not_the_memory_limit(run: RunFn) -> None:
    result = run("import sys; print('MemoryError', file=sys.stderr); sys.exit(1)")
    assert result.status == Status.ERROR, result


# --- no request ends the jail ---------------------------------------------------------------------


def test_a_long_fetch_list_is_answered_and_the_jail_serves_on(
    run: RunFn, executor: JailExecutor
) -> None:
    zygote = executor.zygote_pid()
    long_ascii = tuple(f"d{i}/" + "a" * 1000 for i in range(3000))  # 3 MB of paths
    result = run("print('ran')", fetch_files=long_ascii)
    assert (result.status, result.stdout, result.files) == (Status.OK, "ran\n", {}), result
    # As many non-ASCII paths as the jail takes, each as long as it takes: 16 MiB in UTF-8.
    astral = tuple(f"{i}" + "\U0001f600" * 1020 for i in range(4096))
    result = run("print('ran')", fetch_files=astral)
    assert (result.status, result.stdout) == (Status.OK, "ran\n"), result.stderr[-500:]
    # More paths than the jail takes: refused with a clear status, nothing run.
    result = run("print('ran')", fetch_files=tuple(f"é{i}" for i in range(11_500)))
    assert result.status == Status.ERROR and "fetch_files" in result.stderr, result
    if executor.mode == "warm":
        assert executor.zygote_pid() == zygote, "the jail was replaced"


def test_a_timeout_below_a_millisecond_is_a_timeout_not_a_refusal(run: RunFn) -> None:
    result = run("print(1)", timeout_s=1e-6)
    assert result.status in (Status.TIMEOUT, Status.OK), result
    assert "malformed" not in result.stderr


# --- sessions -------------------------------------------------------------------------------------


def test_a_replay_broken_by_the_sessions_own_cell_is_its_error() -> None:
    settings = Settings(cgroup_parent=JAIL_CGROUP_PARENT, max_sessions_per_worker=2)
    pool = SessionPool(settings, slot=10, spares=0)
    try:
        deadline = time.time() + 1.0
        recorded = RecordedCell(
            f"import os, time\nif time.time() > {deadline}:\n    os._exit(3)\nx = 1"
        )
        first = pool.run_cell("s-diverge", ExecutionSpec(code=recorded.code))
        assert first.alive, first.result
        pool.end("s-diverge")
        time.sleep(max(0.0, deadline - time.time()) + 0.1)
        replayed = pool.run_cell("s-diverge", ExecutionSpec(code="print(x)"), history=[recorded])
        assert replayed.result.status == Status.ERROR, replayed.result
        assert replayed.restored and not replayed.alive
        assert "replayed" in replayed.result.stderr
    finally:
        pool.close()


# --- seccomp: stream protocols other than TCP -----------------------------------------------------


def test_sctp_and_mptcp_stream_sockets_are_refused_and_tcp_works(run: RunFn) -> None:
    # SOCK_STREAM with IPPROTO_SCTP (132) or IPPROTO_MPTCP (262) passed the type check: other
    # kernel code than TCP's, which no program here needs.
    result = run(
        code("""
        import errno, socket
        for family in (socket.AF_INET, socket.AF_INET6):
            for kind in (socket.SOCK_STREAM, socket.SOCK_STREAM | socket.SOCK_NONBLOCK):
                for proto in (132, 262, 17, 999):
                    try:
                        socket.socket(family, kind, proto).close()
                        print("OPENED", family.name, proto)
                    except OSError as exc:
                        print(errno.errorcode.get(exc.errno, exc.errno))
                for proto in (0, socket.IPPROTO_TCP):
                    socket.socket(family, kind, proto).close()
        print("tcp ok")
        """)
    )
    assert result.status == Status.OK, result
    lines = result.stdout.splitlines()
    assert lines[-1] == "tcp ok"
    assert set(lines[:-1]) == {"EPROTONOSUPPORT"}, lines
