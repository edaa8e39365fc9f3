"""Interleaved A/B of two jail directories: CPU per call of each, measured in the same minutes.

Starts one warm slot on each directory's in-jail program (both alive at once), then runs blocks of
calls alternating between them (ABBA order), so that the machine's drift falls on both alike.
Prints, for each, the mean CPU per call of the executor's thread, the zygote and the programs
it reaped, and the zygote's heap shape (anonymous memory, how much of it is on huge pages).

    .venv/bin/python scripts/jail_ab.py DIR_A DIR_B [--blocks 20] [--per-block 25]
        [--code 'print(1)'] [--file-kb 0]

DIR is a copy of sandbox_service/jail/inside (a second worktree's). Needs root, like the
workers; run it under the test lock on a shared machine. Even so, expect a few percent between
two copies of the same code (run A against A to see this machine's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> tuple[float, float]:
    """(own CPU seconds from the kernel's clock, reaped children's CPU seconds in ticks)."""
    own = time.clock_gettime(((~pid) << 3) | 2)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return own, (int(fields[13]) + int(fields[14])) / TICK


def heap_shape(pid: int) -> str:
    """The zygote's anonymous memory, the part mapped by huge pages, the part on 4 KiB pages
    (not in any huge page, even a split one: what a fork copies one entry at a time), and its
    page tables."""
    rollup = {
        line.split(":")[0]: int(line.split()[1])
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
        if line.startswith(("Anonymous:", "AnonHugePages:"))
    }
    pte = Path(f"/proc/{pid}/status").read_text().split("VmPTE:")[1].split()[0]
    return (
        f"anon {rollup['Anonymous'] >> 10} MiB, huge pages {rollup['AnonHugePages'] >> 10} MiB,"
        f" on 4 KiB pages {small_page_kib(pid) >> 10} MiB, VmPTE {pte} kB"
    )


KPF_ANON, KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL, KPF_THP = 12, 15, 16, 22


def small_page_kib(pid: int) -> int:
    """KiB of the process's anonymous pages that are single 4 KiB folios (/proc/kpageflags)."""
    small = 0
    with (
        open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap,
        open("/proc/kpageflags", "rb", buffering=0) as flags,
    ):
        for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
            span, perms = line.split()[:2]
            if "w" not in perms:
                continue
            low, high = (int(x, 16) for x in span.split("-"))
            entries = os.pread(pagemap.fileno(), 8 * ((high - low) >> 12), 8 * (low >> 12))
            for (entry,) in struct.iter_unpack("Q", entries):
                if not entry >> 63:  # not present
                    continue
                pfn = entry & ((1 << 55) - 1)
                (page,) = struct.unpack("Q", os.pread(flags.fileno(), 8, 8 * pfn))
                large = page >> KPF_THP | page >> KPF_COMPOUND_HEAD | page >> KPF_COMPOUND_TAIL
                small += 4 if page >> KPF_ANON & 1 and not large & 1 else 0
    return small


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs=2, help="two copies of sandbox_service/jail")
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--per-block", type=int, default=25)
    parser.add_argument("--code", default="print(1)")
    parser.add_argument("--file-kb", type=int, default=0, help="an input file of this size")
    args = parser.parse_args()
    from sandbox_service.execution import ExecutionSpec, Limits
    from sandbox_service.jail import JailExecutor, executor
    from sandbox_service.settings import Settings

    executors = []
    for i, directory in enumerate(args.dirs):
        executor.INSIDE_SOURCE = str(Path(directory))  # what make_layout mounts
        settings = Settings(cgroup_parent="rl-sandbox-phases", idle_warm_up="never")
        executors.append(JailExecutor(settings, slot=50 + i, mode="warm"))
    files = {"data.bin": os.urandom(args.file_kb * 1024)} if args.file_kb else {}
    spec = ExecutionSpec(code=args.code, limits=Limits(timeout_s=10), files=files)
    per = args.per_block
    try:
        for ex in executors:
            for _ in range(20):
                assert ex.run(spec).status == "ok"
        cpu: list[dict[str, list[float]]] = [
            {"executor": [], "zygote": [], "programs": []} for _ in executors
        ]
        for block in range(args.blocks):
            order = [0, 1] if block % 2 == 0 else [1, 0]
            for i in order:
                ex = executors[i]
                assert ex._jail is not None
                zygote_pid = ex._jail.zygote_pid
                z0, c0 = cpu_of(zygote_pid)
                t0 = time.thread_time()
                for _ in range(per):
                    result = ex.run(spec)
                    assert result.status == "ok", result
                t1 = time.thread_time()
                z1, c1 = cpu_of(zygote_pid)
                cpu[i]["executor"].append((t1 - t0) / per)
                cpu[i]["zygote"].append((z1 - z0) / per)
                cpu[i]["programs"].append((c1 - c0) / per)
        print(
            f"load {os.getloadavg()[0]:.1f}, {args.blocks} blocks of {per} calls each,"
            f" code {args.code[:40]!r}, input file {args.file_kb} KiB; CPU ms per call:"
        )
        for directory, parts, ex in zip(args.dirs, cpu, executors, strict=True):
            assert ex._jail is not None
            totals = [sum(x) for x in zip(*parts.values(), strict=True)]
            print(
                f"  {directory}: "
                + ", ".join(f"{k} {1000 * statistics.mean(v):.3f}" for k, v in parts.items())
                + f", total {1000 * statistics.mean(totals):.3f}"
                f" (median of blocks {1000 * statistics.median(totals):.3f});"
                f" zygote {heap_shape(ex._jail.zygote_pid)}"
            )
    finally:
        for ex in executors:
            ex.close()


if __name__ == "__main__":
    main()
