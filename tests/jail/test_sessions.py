"""Sessions at the jail level: persistent interpreters in their own warm jails."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from sandbox_service.execution import ExecutionSpec, Limits, RecordedCell, Status
from sandbox_service.jail.sessions import SessionPool
from sandbox_service.settings import Settings
from tests.host_tag import JAIL_CGROUP_PARENT

LIMITS = Limits(timeout_s=5.0, memory_mb=512, max_processes=32, max_output_bytes=4096)


@pytest.fixture(scope="module")
def pool() -> Iterator[SessionPool]:
    settings = Settings(
        cgroup_parent=JAIL_CGROUP_PARENT, max_sessions_per_worker=3, session_ttl_s=60
    )
    p = SessionPool(settings, slot=9, spares=1)
    yield p
    p.close()


def cell(code: str, **limits: object) -> ExecutionSpec:
    return ExecutionSpec(code=code, limits=Limits(**{**_as_dict(LIMITS), **limits}))  # type: ignore[arg-type]


def _as_dict(limits: Limits) -> dict[str, object]:
    return {name: getattr(limits, name) for name in limits.__slots__}  # type: ignore[attr-defined]


def test_state_persists_across_cells_with_notebook_output(pool: SessionPool) -> None:
    first = pool.run_cell("s-state", cell("import math\nx = 40\ndef f(v):\n    return v + 2"))
    assert first.result.status == Status.OK and first.result.stdout == ""
    assert first.alive and not first.restored
    second = pool.run_cell("s-state", cell("f(x)"))
    assert second.result.stdout == "42\n"
    third = pool.run_cell("s-state", cell("print('printed')\nNone"))
    assert third.result.stdout == "printed\n"
    fourth = pool.run_cell("s-state", cell("y = math.factorial(5)\ny"))
    assert fourth.result.stdout == "120\n"


def test_cell_errors_keep_the_session(pool: SessionPool) -> None:
    pool.run_cell("s-err", cell("z = 5"))
    failed = pool.run_cell("s-err", cell("1 / 0"))
    assert failed.result.status == Status.ERROR and failed.alive
    assert "ZeroDivisionError" in failed.result.stderr
    assert pool.run_cell("s-err", cell("z * 2")).result.stdout == "10\n"


@pytest.mark.parametrize(
    ("code", "frames"),
    [
        ("def f():\n    return missing\nvalue = f()", ["line 3, in <module>", "line 2, in f"]),
        ("def f():\n    return missing\nf()", ["line 3, in <module>", "line 2, in f"]),
        ("class R:\n    def __repr__(self):\n        return missing\nR()", ["line 3"]),
    ],
    ids=["statement", "last-expression", "repr-of-the-value"],
)
def test_a_cells_traceback_shows_only_the_cells_own_frames(
    pool: SessionPool, code: str, frames: list[str]
) -> None:
    failed = pool.run_cell("s-traceback", cell(code)).result
    assert failed.error is not None and failed.error.ename == "NameError"
    shown = "".join(failed.error.traceback)
    assert "zygote" not in shown and "zygote" not in failed.stderr, shown
    lines = [line for line in shown.splitlines() if line.startswith("  File ")]
    assert len(lines) == len(frames), shown
    for line, frame in zip(lines, frames, strict=True):
        assert line.startswith('  File "<cell>"') and frame in line, shown


def test_sessions_never_see_each_other(pool: SessionPool) -> None:
    pool.run_cell("s-a", cell("secret = 'A'\nopen('/tmp/a.txt', 'w').write('A')"))
    seen = pool.run_cell(
        "s-b",
        cell("import os\nprint('secret' in globals(), os.path.exists('/tmp/a.txt'))"),
    )
    assert seen.result.stdout == "False False\n"


def test_timeout_discards_the_interpreter_and_replay_restores_it(pool: SessionPool) -> None:
    history = [RecordedCell("counter = 10"), RecordedCell("counter += 5")]
    for recorded in history:
        assert pool.run_cell("s-t", cell(recorded.code)).alive
    stuck = pool.run_cell("s-t", cell("while True: pass", timeout_s=1.0))
    assert stuck.result.status == Status.TIMEOUT and not stuck.alive
    assert not pool.is_live("s-t")
    back = pool.run_cell("s-t", cell("print(counter)"), history=history)
    assert back.restored and back.alive
    assert back.result.stdout == "15\n"  # the replayed cells' output is discarded


def test_replay_gives_each_cell_its_own_stdin_and_input_files(pool: SessionPool) -> None:
    history = [
        RecordedCell("name = input()", stdin="ada\n"),
        RecordedCell("data = open('in/data.bin', 'rb').read()", files={"in/data.bin": b"\x00\xff"}),
    ]
    back = pool.run_cell(
        "s-in", cell("import os\nprint(name, data, sorted(os.listdir('in')))"), history
    )
    assert back.restored, back
    assert back.result.stdout == "ada b'\\x00\\xff' ['data.bin']\n", back.result


def test_a_module_written_by_one_cell_is_importable_in_the_next(pool: SessionPool) -> None:
    first = pool.run_cell(
        "s-mod",
        cell(
            "try:\n    import later\nexcept ImportError:\n    print('not yet')\n"
            "_ = open('later.py', 'w').write('WHEN = 2')"
        ),
    )
    assert first.result.stdout == "not yet\n", first.result
    second = pool.run_cell("s-mod", cell("import later\nlater.WHEN"))
    assert second.result.stdout == "2\n", second.result


def test_crash_discards_the_interpreter(pool: SessionPool) -> None:
    pool.run_cell("s-crash", cell("v = 1"))
    crash = pool.run_cell("s-crash", cell("import os\nos._exit(3)"))
    assert crash.result.status == Status.ERROR and crash.result.exit_code == 3
    assert not crash.alive


def test_output_belongs_to_its_cell_even_with_background_threads(pool: SessionPool) -> None:
    pool.run_cell(
        "s-bg",
        cell(
            "import threading, time, sys\n"
            "def spam():\n"
            "    while True:\n"
            "        time.sleep(0.01)\n"
            "threading.Thread(target=spam, daemon=True).start()\n"
            "print('started')"
        ),
    )
    nxt = pool.run_cell("s-bg", cell("print('second cell')"))
    assert nxt.result.stdout == "second cell\n"


def test_lru_eviction_and_restore(pool: SessionPool) -> None:
    for sid in ("s-a", "s-b", "s-t", "s-state", "s-err", "s-bg"):
        pool.end(sid)
    pool.run_cell("e1", cell("a = 1"))
    pool.run_cell("e2", cell("a = 2"))
    pool.run_cell("e3", cell("a = 3"))
    fourth = pool.run_cell("e4", cell("a = 4"))
    assert fourth.evicted == ("e1",)
    assert not pool.is_live("e1")
    again = pool.run_cell("e1", cell("a"), history=[RecordedCell("a = 1")])
    assert again.restored and again.result.stdout == "1\n"


def test_idle_sessions_expire(pool: SessionPool) -> None:
    pool.run_cell("idle", cell("q = 1"))
    import time

    assert "idle" in pool.expire_idle(now=time.monotonic() + 3600)
    assert not pool.is_live("idle")


def test_session_memory_limit_covers_the_whole_session(pool: SessionPool) -> None:
    pool.run_cell("s-mem", cell("keep = bytearray(150 * 1024 * 1024)", memory_mb=256))
    more = pool.run_cell("s-mem", cell("more = bytearray(150 * 1024 * 1024)", memory_mb=256))
    assert more.result.status == Status.MEMORY_LIMIT


# --- issue 12: a cell cannot reach its jail's machinery -----------------------------------------

_CHANNEL_FDS = (
    "import os, resource, stat\n"
    "def _socket(fd):\n"
    "    try:\n"
    "        return stat.S_ISSOCK(os.fstat(fd).st_mode)\n"
    "    except OSError:\n"
    "        return False\n"
    "channel = [fd for fd in range(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
    "           if _socket(fd)]\n"
)


def _answers_next(pool: SessionPool, session_id: str) -> None:
    """The pool serves the session again (rebuilt if it had to be)."""
    again = pool.run_cell(session_id, cell("print('served')"))
    assert again.result.status == Status.OK and again.result.stdout == "served\n", again


def test_a_forged_or_malformed_report_on_the_channel_ends_only_that_session(
    pool: SessionPool,
) -> None:
    pool.run_cell("s-forge", cell("kept = 1"))
    for junk in (
        b"\x00\x00\x00\x05[1,2]",  # a frame that is not an object
        b'\x00\x00\x00\x1a{"op":"done","exit_code":-7}',  # out of range
        b"\xff\xff\xff\xff",  # a length past any bound
    ):
        forged = pool.run_cell(
            "s-forge",
            cell(
                _CHANNEL_FDS + f"for fd in channel:\n    os.write(fd, {junk!r})\nimport time\n"
                "time.sleep(0.5)"
            ),
        )
        assert forged.result.status == Status.ERROR, f"junk was believed: {forged.result}"
        assert "broke its channel" in forged.result.stderr
        assert not forged.alive
        _answers_next(pool, "s-forge")


def test_half_a_frame_on_the_channel_times_the_cell_out(pool: SessionPool) -> None:
    half = pool.run_cell(
        "s-half",
        cell(
            _CHANNEL_FDS + "for fd in channel:\n    os.write(fd, b'\\x00\\x00\\x00\\x40{\"op')\n"
            "import time\ntime.sleep(30)",
            timeout_s=1.0,
        ),
    )
    assert half.result.status == Status.TIMEOUT, half.result
    _answers_next(pool, "s-half")


def test_the_cell_holds_no_worker_control_socket(pool: SessionPool) -> None:
    seen = pool.run_cell("s-fds", cell(_CHANNEL_FDS + "print(len(channel))"))
    assert seen.result.stdout == "1\n", f"more than the private channel: {seen.result}"


def test_a_fifo_over_an_input_file_does_not_hang_the_next_cell(pool: SessionPool) -> None:
    pool.run_cell("s-fifo", cell("import os\nos.mkfifo('in.txt')"))
    spec = ExecutionSpec(code="print(open('in.txt').read())", files={"in.txt": b"x"}, limits=LIMITS)
    blocked = pool.run_cell("s-fifo", spec)
    assert blocked.result.status == Status.ERROR, blocked.result
    assert (
        "not a regular file" in blocked.result.stderr or "No such device" in blocked.result.stderr
    )
    _answers_next(pool, "s-fifo")


def test_background_processes_end_with_their_cell(pool: SessionPool) -> None:
    started = pool.run_cell(
        "s-spin",
        cell("import os\npid = os.fork()\nif pid == 0:\n    while True: pass\nprint('forked')"),
    )
    assert started.result.stdout == "forked\n", started.result
    checked = pool.run_cell(
        "s-spin",
        cell(
            "import os\nprint(os.waitpid(pid, os.WNOHANG)[0] == pid or "
            "not os.path.exists(f'/proc/{pid}/stat') or "
            "open(f'/proc/{pid}/stat').read().split(') ')[1][0] == 'Z')"
        ),
    )
    assert checked.result.stdout == "True\n", f"a background spinner survived its cell: {checked}"


def test_processes_a_keeping_cell_leaves_run_on_until_a_cell_that_does_not_keep(
    pool: SessionPool,
) -> None:
    """E2B's sandboxes: a cell with keep_processes leaves its processes running (charged to the
    session's cgroups, ended with its jail); the next cell without it kills them as usual."""
    alive = (
        "import os\nprint(os.waitpid(pid, os.WNOHANG)[0] == 0 and "
        "open(f'/proc/{pid}/stat').read().split(') ')[1][0] != 'Z')"
    )
    started = pool.run_cell(
        "s-keep",
        replace(
            cell("import subprocess\npid = subprocess.Popen(['sleep', '60']).pid"),
            keep_processes=True,
        ),
    )
    assert started.result.status == Status.OK, started.result
    kept = pool.run_cell("s-keep", replace(cell(alive), keep_processes=True))
    assert kept.result.stdout == "True\n", f"the kept process is gone: {kept.result}"
    pool.run_cell("s-keep", cell("pass"))  # a cell that does not keep
    ended = pool.run_cell("s-keep", cell(alive))
    assert ended.result.stdout == "False\n", f"the process outlived a plain cell: {ended.result}"


def test_session_jail_has_a_cpu_limit_and_its_cpu_time_is_the_kernels(pool: SessionPool) -> None:
    spun = pool.run_cell(
        "s-cpu",
        cell("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"),
    )
    assert spun.result.status == Status.OK
    assert 0.25 <= spun.result.cpu_time < 5.0, spun.result
    cgroups = pool._live["s-cpu"].cgroups
    if cgroups.v2:
        limit = (cgroups.dirs["unified"] / "cpu.max").read_text().split()[0]
    else:
        limit = (cgroups.dirs["cpu"] / "cpu.cfs_quota_us").read_text().strip()
    assert limit == "100000", f"the session jail has no one-core CPU limit: {limit}"


def test_a_cells_seed_seeds_it_at_its_start_and_in_a_replay(pool: SessionPool) -> None:
    from dataclasses import replace

    pool.run_cell("s-seed-a", cell("import random\nrandom.random()"))
    seeded = replace(cell("import numpy\nx = (random.random(), numpy.random.rand())\nx"), seed=5)
    first = pool.run_cell("s-seed-a", seeded).result
    assert first.status == Status.OK, first.stderr
    pool.run_cell("s-seed-b", cell("import random"))
    assert pool.run_cell("s-seed-b", seeded).result.stdout == first.stdout
    # A session rebuilt from its records replays the seeded cell with its seed.
    pool.end("s-seed-b")
    history = (RecordedCell("import random"), RecordedCell.of(seeded))
    rebuilt = pool.run_cell("s-seed-b", cell("x"), history)
    assert rebuilt.restored and rebuilt.result.stdout == first.stdout
    pool.end("s-seed-a")
    pool.end("s-seed-b")
