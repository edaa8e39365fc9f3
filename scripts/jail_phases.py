# ruff: noqa: E501  (the instrumentation is source text spliced into the jail's modules, one line each)
"""Where the CPU of one jailed call goes: per-phase clocks of the zygote and of its children.

Makes an instrumented copy of sandbox_service/jail/inside/ (serve.py and child.py) under --work
(CPU clocks around fork, reap, wipe, reply in the zygote; marks in the child, written to a page
shared with the zygote, so nothing of the product changes), runs one warm slot on it, and prints
the CPU per call of each phase, of the zygote, of its programs (reaped children) and of the
executor's side. The child's exit teardown is its kernel rusage less its last mark.

    .venv/bin/python scripts/jail_phases.py [--calls 300] [--code 'print(1)'] [--zygote-dir D] [--zygote lean|math|data]

--zygote-dir instruments another copy of the inside/ directory (to compare two commits in one run).
Needs root, like the workers; run it under the test lock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

INSTRUMENTED = ("serve.py", "child.py")
"""The modules of inside/ the phases are spliced into: a plain run's loop and its child."""
PHASES_MODULE = """import mmap as _mmap, resource, struct as _struct, time
_SHM = _mmap.mmap(-1, 4096)
_Z = {}
def _now():
    return time.thread_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def _zt(name, t0):
    _Z[name] = _Z.get(name, 0.0) + time.thread_time() - t0[0]
    _Z["z:" + name] = _Z.get("z:" + name, 0) + resource.getrusage(resource.RUSAGE_SELF).ru_minflt - t0[1]
def _cmark(i):
    # getrusage first: it brings the process's CPU clock up to date, which a run's CPU-time
    # limit (a group timer) otherwise leaves behind by up to a tick, so a phase's CPU would be
    # counted in the next mark's (the program's in its end).
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    _struct.pack_into("d", _SHM, 8 * i, time.process_time())
    _struct.pack_into("d", _SHM, 64 + 8 * i, faults)
"""
"""Shared page (child phase clocks, 8 doubles) and zygote accumulators (printed at exit)."""
PHASES_IMPORTS = (
    "import json, os, resource, sys, time\n"
    "from ._phases import _SHM, _Z, _cmark, _now, _struct, _zt\n"
    "from .libc import _libc\n"
)


def _sub(texts: dict[str, str], old: str, new: str) -> None:
    """Replace `old` in whichever instrumented module holds it."""
    for name, text in texts.items():
        if old in text:
            texts[name] = text.replace(old, new, 1)
            return
    raise SystemExit(f"inside/ changed: instrument again by hand near {old[:60]!r}")


def _block(text: str) -> str:
    """A triple-quoted block as written here (its lines after the first indented four spaces
    deeper than in the module, by the formatter) as it stands in the module."""
    first, *rest = text.split("\n")
    return "\n".join([first, *(line.removeprefix("    ") for line in rest)])


def _sub_block(texts: dict[str, str], old: str, new: str) -> None:
    _sub(texts, _block(old), _block(new))


FLOOR_AT = '    """Answer run requests through pre-forked children until told to exit (cold mode: one)."""\n'
FLOOR = """    def _floor(fork, exit):
        t0, c0 = time.thread_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        for _ in range(N_FORKS):
            pid = fork()
            if pid == 0:
                exit(0)
            os.waitpid(pid, 0)
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        child = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
        return (time.thread_time() - t0) / N_FORKS, child / N_FORKS, (c1.ru_minflt - c0.ru_minflt) / N_FORKS
    _floor(os.fork, os._exit)
    _Z["floor"] = {"os.fork": _floor(os.fork, os._exit), "libc fork": _floor(_libc().fork, _libc()._exit)}
"""
"""The floor of a fork per call: the zygote forks children that exit at once (os.fork, which
runs the interpreter's at-fork work in the child, and libc's fork, which does not), inside the
jail's cgroups, before it serves."""


def instrument(src: Path, dst: Path, floor_forks: int = 0) -> Path:
    """An instrumented copy of the jail's inside/ directory in dst; its path."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    (dst / "_phases.py").write_text(PHASES_MODULE)
    s = {name: (src / name).read_text() for name in INSTRUMENTED}
    # child marks
    _sub(
        s,
        "        prepare_child()\n        if warm_up:",
        "        _cmark(0)\n        prepare_child()\n        _cmark(1)\n        if warm_up:",
    )
    _sub(
        s,
        "        code_fd, stdin_fd, stdout_fd, stderr_fd = fds\n        os.dup2(stdin_fd, 0)",
        "        _cmark(2)\n        code_fd, stdin_fd, stdout_fd, stderr_fd = fds\n        os.dup2(stdin_fd, 0)",
    )
    _sub(
        s,
        '        status = _run_source(source, sys.modules["__main__"].__dict__)\n',
        '        _cmark(3)\n        status = _run_source(source, sys.modules["__main__"].__dict__)\n        _cmark(4)\n',
    )
    _sub(
        s,
        "        status = finish(status)\n",
        "        status = finish(status)\n        _cmark(5)\n",
    )
    # zygote phases
    _sub(
        s,
        "    try:\n        pid = fork_lean()\n    except OSError:",
        "    _t = time.thread_time()\n    try:\n        pid = fork_lean()\n    except OSError:",
    )
    _sub(
        s,
        "    os.close(forward_w)\n    os.close(go_r)\n    return _Standby(",
        "    _zt('fork', _t)\n    os.close(forward_w)\n    os.close(go_r)\n    return _Standby(",
    )
    _sub(
        s,
        "    if ahead is None:\n        _kill_everyone_else()\n    else:\n        _reap_all_but(ahead.pid)\n    fresh_scratch()\n",
        "    _t = time.thread_time()\n    if ahead is None:\n        _kill_everyone_else()\n    else:\n        _reap_all_but(ahead.pid)\n    _zt('reap', _t); _t = time.thread_time()\n    fresh_scratch()\n    _zt('wipe', _t)\n",
    )
    _sub(
        s,
        "                cpu = usage.ru_utime + usage.ru_stime\n",
        "                cpu = usage.ru_utime + usage.ru_stime\n                _Z['_minflt'] = usage.ru_minflt\n",
    )
    if floor_forks:
        _sub(s, FLOOR_AT, FLOOR_AT + FLOOR.replace("N_FORKS", str(floor_forks)))
    # around the wait for the program, whichever way supervise() spells it
    _sub(
        s,
        '    """Wait for the program to end or time out, kill its whole tree, describe the outcome."""\n',
        '    """Wait for the program to end or time out, kill its whole tree, describe the outcome."""\n    _t = time.thread_time()\n',
    )
    _sub_block(
        s,
        """    wall = time.monotonic() - taken.started
    """,
        """    _zt('wait_child', _t)
        c = _struct.unpack_from("6d", _SHM, 0)
        f = _struct.unpack_from("6d", _SHM, 64)
        for i, name in enumerate(("c:prepare", "c:take_request", "c:setup", "c:program", "c:finish")):
            _Z[name] = _Z.get(name, 0.0) + c[i + 1] - c[i]
            _Z["f:" + name[2:]] = _Z.get("f:" + name[2:], 0.0) + f[i + 1] - f[i]
        _Z["f:to_first_mark"] = _Z.get("f:to_first_mark", 0.0) + f[0]
        _Z["f:exit_teardown"] = _Z.get("f:exit_teardown", 0.0) + _Z.pop("_minflt") - f[5]
        _Z["c:to_first_mark"] = _Z.get("c:to_first_mark", 0.0) + c[0]
        _Z["c:exit_teardown"] = _Z.get("c:exit_teardown", 0.0) + cpu - c[5]
        _Z["c:total"] = _Z.get("c:total", 0.0) + cpu
        _Z["runs"] = _Z.get("runs", 0) + 1
        wall = time.monotonic() - taken.started
    """,
    )
    _sub_block(
        s,
        """        current = _choose_standby(sock, current, idle_warm_up)
            current.release()
            taken = _take(current)
            current.lines.close()""",
        """        _t = time.thread_time()
            current = _choose_standby(sock, current, idle_warm_up)
            _zt('choose', _t); _t = time.thread_time()
            current.release()
            taken = _take(current)
            current.lines.close()
            _zt('release_take', _t)""",
    )
    _sub_block(
        s,
        """        reply = dataclasses.replace(reply, warmed=current.warmed)
            sock.sendall(protocol.reply_frame(reply)[1])""",
        """        _t = time.thread_time()
            reply = dataclasses.replace(reply, warmed=current.warmed)
            sock.sendall(protocol.reply_frame(reply)[1])
            _zt('reply', _t)
            if _Z.get("runs", 0) % 50 == 0:
                print("PHASES", json.dumps(_Z), file=sys.stderr, flush=True)""",
    )
    future = "from __future__ import annotations\n"
    for name, text in s.items():
        text = text.replace("_t = time.thread_time()", "_t = _now()")
        (dst / name).write_text(text.replace(future, future + PHASES_IMPORTS, 1))
    return dst


TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> tuple[float, float]:
    """(own CPU seconds from the kernel's clock, reaped children's CPU seconds in ticks)."""
    own = time.clock_gettime(((~pid) << 3) | 2)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return own, (int(fields[13]) + int(fields[14])) / TICK


def main() -> None:
    from sandbox_service.jail.inside.heap import ZYGOTES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--gap-ms", type=float, default=0, help="idle time before each call")
    parser.add_argument("--code", default="print(1)")
    parser.add_argument("--warm-up", default="never", help="idle_warm_up of the slot")
    parser.add_argument("--zygote-dir", default=None, help="the jail directory to instrument")
    parser.add_argument("--work", default="/tmp/rl-sandbox-jail-phases")
    parser.add_argument("--floor", type=int, default=0, help="measure N bare forks first")
    parser.add_argument(
        "--zygote",
        choices=ZYGOTES,
        default="data",
        help="which of a slot's zygotes (jail/zygotes.py)",
    )
    args = parser.parse_args()
    from sandbox_service.execution import ExecutionSpec, Limits
    from sandbox_service.jail import JailExecutor, executor
    from sandbox_service.settings import Settings

    src = Path(args.zygote_dir or executor.INSIDE_SOURCE)
    work = Path(args.work) / f"{os.getpid()}"
    executor.INSIDE_SOURCE = str(instrument(src, work, args.floor))  # what make_layout mounts
    os.chmod(args.work, 0o755)
    settings = Settings(cgroup_parent="rl-sandbox-phases", idle_warm_up=args.warm_up)
    ex = JailExecutor(settings, slot=40, mode="warm", zygote=args.zygote)
    try:
        spec = ExecutionSpec(code=args.code, limits=Limits(timeout_s=10))
        for _ in range(20):
            ex.run(spec)
        jail = ex._jail
        assert jail is not None and jail._proc is not None
        zpid, npid = jail.zygote_pid, jail._proc.pid
        z0, zc0 = cpu_of(zpid)
        n0, _ = cpu_of(npid)
        w0 = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
        latencies = []
        for _ in range(args.calls):
            if args.gap_ms:
                time.sleep(args.gap_ms / 1000)
            started = time.perf_counter()
            result = ex.run(spec)
            latencies.append(time.perf_counter() - started)
            assert result.status == "ok", result
        z1, zc1 = cpu_of(zpid)
        n1, _ = cpu_of(npid)
        w1 = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
        n = args.calls
        parts = {
            "executor": w1 - w0, "zygote": z1 - z0, "programs": zc1 - zc0, "nsjail": n1 - n0
        }  # fmt: skip
        print(
            f"load {os.getloadavg()[0]:.1f}, {n} calls, p50 {statistics.median(latencies) * 1000:.2f}"
            " ms; CPU ms per call: "
            + ", ".join(f"{k} {1000 * v / n:.2f}" for k, v in parts.items())
            + f", total {1000 * sum(parts.values()) / n:.2f}"
        )
        lines = [x for x in ex._log_path.read_text().splitlines() if "PHASES" in x]
        phases = json.loads(lines[-1].split("PHASES", 1)[1])
        runs = phases.pop("runs")
        floor = phases.pop("floor", None)
        faults = {k[2:]: v for k, v in phases.items() if k.startswith("f:")}
        faults |= {k[2:]: v for k, v in phases.items() if k.startswith("z:")}
        print(
            f"phases, ms per run over {runs} runs (minor faults per run, the zygote's or the child's):"
        )
        for name, value in phases.items():
            if not name.startswith(("f:", "z:")):
                fault = faults.get(name[2:] if name.startswith("c:") else name)
                extra = "" if fault is None else f"  {fault / runs:7.0f} faults"
                print(f"  {name:18} {1000 * value / runs:7.3f}{extra}")
        for how, (zygote, child, child_faults) in (floor or {}).items():
            print(
                f"floor ({how} + _exit, {args.floor} times): zygote {1000 * zygote:.3f} ms,"
                f" child {1000 * child:.3f} ms ({child_faults:.0f} faults) per fork"
            )
    finally:
        ex.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
