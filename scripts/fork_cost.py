"""What a fork and its child's exit cost per MiB of the parent's memory, by how it is mapped.

Forks children that exit at once (libc's fork and _exit, as the zygote's standbys do) from a
process that holds, in turn, more private anonymous memory: on huge pages (one PMD entry per
2 MiB), on huge pages whose mapping was split since (512 page-table entries over one large
folio, as the zygote's heap is after its first runs), and on 4 KiB pages (one entry and one
folio per page, as arenas the kernel could not collapse), after first adding mappings, by
importing the standard library's extension modules (about five per shared library, as most of the
zygote's 300 are). Prints the parent's and the child's CPU per fork after each step, and what a
child's first write to a page shared with its parent adds to its CPU: on a huge page, the split
of the child's mapping into 512 entries (torn down again at its exit) and a 4 KiB copy; on a
4 KiB page, the copy alone.

    .venv/bin/python scripts/fork_cost.py [--mib 32] [--forks 300]

Needs no root and no jail: one process of this interpreter.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import mmap
import os
import resource
import sys
import time

HUGE = 2 << 20
MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_COLLAPSE = 14, 15, 25
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
FORK = ctypes.PyDLL(None).fork
KEEP: list[mmap.mmap] = []
EXTENSION_MODULES = (
    *("_json", "_socket", "select", "array", "_struct", "cmath", "_decimal", "_datetime"),
    *("_random", "_bisect", "_heapq", "_pickle", "_hashlib", "_ssl", "zlib", "_bz2", "_lzma"),
    *("binascii", "_csv", "_posixsubprocess", "fcntl", "mmap", "termios", "unicodedata"),
    *("_multibytecodec", "_elementtree", "pyexpat", "_sqlite3", "_uuid", "_queue", "_asyncio"),
    *("_zoneinfo", "_statistics", "_lsprof", "_ctypes", "_blake2", "_sha2", "_md5", "_sha1"),
    *("_sha3", "_posixshmem", "_multiprocessing", "_contextvars", "grp", "resource", "_dbm"),
)
"""Extension modules of the standard library (shared libraries in most builds) to map more."""


def touched(mib: int, advice: int) -> tuple[mmap.mmap, int]:
    """A private anonymous mapping of mib MiB (plus slack for alignment), every page written;
    the mapping and the first huge-page boundary in it."""
    size = (mib << 20) + HUGE
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    LIBC.madvise(address, size, advice)
    for offset in range(0, size, 4096):
        region[offset] = 1
    KEEP.append(region)
    return region, -(-address // HUGE) * HUGE - address


def per_fork(forks: int, writes: tuple[mmap.mmap, range] | None = None) -> str:
    """The parent's and each child's CPU per fork; with `writes`, each child first writes one
    byte at each of those offsets of the mapping."""
    return "parent {:.3f} ms, child {:.3f} ms".format(*fork_cpu_ms(forks, writes))


def fork_cpu_ms(forks: int, writes: tuple[mmap.mmap, range] | None = None) -> tuple[float, float]:
    t0, c0 = time.thread_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(forks):
        pid = FORK()
        if pid == 0:
            if writes is not None:
                region, offsets = writes
                for offset in offsets:
                    region[offset] = 3
            LIBC._exit(0)
        os.waitpid(pid, 0)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
    parent = time.thread_time() - t0
    return 1000 * parent / forks, 1000 * child / forks


def per_page_written(forks: int, region: mmap.mmap, offsets: range) -> str:
    """What a child's first write to each of these pages adds to its CPU, per page."""
    bare = fork_cpu_ms(forks)[1]
    writing = fork_cpu_ms(forks, (region, offsets))[1]
    each_us = 1000 * (writing - bare) / len(offsets)
    return f"child {writing:.3f} ms, {each_us:.1f} us per page written"


def anon_huge_mib() -> float:
    with open("/proc/self/smaps_rollup") as f:
        return int(f.read().split("AnonHugePages:")[1].split()[0]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--forks", type=int, default=300)
    args = parser.parse_args()
    mib = args.mib
    print(f"per fork, this process as it started ({mappings()} mappings): {per_fork(args.forks)}")
    before = mappings()
    for name in EXTENSION_MODULES:
        if name not in sys.modules:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    print(f"+{mappings() - before} mappings ({mappings()} in all): {per_fork(args.forks)}")
    region, start = touched(mib, MADV_HUGEPAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region)) + start
    ranges = range(base, base + (mib << 20), HUGE)
    collapsed = sum(LIBC.madvise(address, HUGE, MADV_COLLAPSE) == 0 for address in ranges)
    print(f"+{mib} MiB on huge pages ({collapsed} collapsed, {anon_huge_mib():.0f} MiB huge):"
          f" {per_fork(args.forks)}")  # fmt: skip
    # A child's first write to a huge page it shares splits its mapping into 512 entries (set
    # up there, torn down at its exit) and copies 4 KiB.
    each_huge_page = range(start, start + (mib << 20), HUGE)
    print(f"  children writing a byte in each of its {len(each_huge_page)} huge pages:"
          f" {per_page_written(args.forks, region, each_huge_page)}")  # fmt: skip
    # A write to a huge page the parent shares with a live child splits the parent's mapping.
    go_r, go_w = os.pipe()
    pid = FORK()
    if pid == 0:
        os.read(go_r, 1)
        LIBC._exit(0)
    for offset in range(start, start + (mib << 20), HUGE):
        region[offset] = 2
    os.write(go_w, b"g")
    os.waitpid(pid, 0)
    print(f"  the same, each huge page's mapping split ({anon_huge_mib():.0f} MiB huge):"
          f" {per_fork(args.forks)}")  # fmt: skip
    small, _ = touched(mib, MADV_NOHUGEPAGE)
    print(f"+{mib} MiB on 4 KiB pages: {per_fork(args.forks)}")
    pages = range(0, mib << 20, HUGE)
    print(f"  children writing a byte in {len(pages)} of its 4 KiB pages, 2 MiB apart:"
          f" {per_page_written(args.forks, small, pages)}")  # fmt: skip


def mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


if __name__ == "__main__":
    main()
