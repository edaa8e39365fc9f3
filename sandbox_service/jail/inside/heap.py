"""The warm zygote's heap: the preloaded stack, exercised, made immortal and frozen, the
allocator's gaps taken and huge pages under it, so that every forked child shares it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import itertools
import os
import sys
import types
from typing import TYPE_CHECKING, Any, Literal

from .libc import _libc
from .outputs import preload_matplotlib

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# --- preloading -----------------------------------------------------------------------------

STDLIB_PRELOAD = (
    *("math", "cmath", "fractions", "decimal", "itertools", "functools", "collections"),
    *("heapq", "bisect", "statistics", "random", "re", "json", "string", "datetime", "time"),
    *("typing", "dataclasses", "copy", "operator", "textwrap", "io", "traceback", "struct"),
    *("array", "enum", "numbers", "hashlib", "base64", "pprint", "threading", "subprocess"),
)


MATH_PRELOAD = ("numpy", "sympy", "mpmath")
"""What the math tool calls (most calls) import; `exercise` warms them. The math and the data
zygote preload them (import_scan.py picks between them per program)."""
DATA_PRELOAD = ("pandas",)
"""The data stack E2B's code interpreter ships, the data zygote's alone: pandas brings about 350
mappings of its own, which every fork and exit of the math zygote would pay (about 0.5 ms a
call, docs/performance.md)."""
FULL_PRELOAD = ("scipy.optimize", "scipy.integrate", "scipy.linalg", "scipy.special")
"""scipy's modules a math tool call uses, preloaded only with --preload-full: they double the
zygote's heap, and every call pays for a larger heap in its fork and exit."""

Zygote = Literal["lean", "math", "data"]
"""What a zygote preloads (import_scan.py names the same three): the standard library's common
modules; and the math stack; and the data stack."""
ZYGOTES: tuple[Zygote, ...] = ("lean", "math", "data")


def zygote_named(name: str) -> Zygote:
    """The zygote `--preload-zygote` names."""
    for zygote in ZYGOTES:
        if zygote == name:
            return zygote
    raise SystemExit(f"--preload-zygote: no zygote {name!r} (one of {', '.join(ZYGOTES)})")


GRADING_PRELOAD = ("grade_candidate", "grade_evaluator")
"""POST /grade's in-jail programs (siblings): a grading run calls the preloaded copy instead of
loading its own (about 5 ms of a run's allocations in the fork)."""


def preload(full: bool = False, zygote: Zygote = "data") -> None:
    """Import and exercise the libraries tool calls use, so forked children skip first-use costs
    (lean: the standard library's and the grading programs alone; full: scipy's common modules
    too, and matplotlib's pyplot in the data zygote)."""
    for name in STDLIB_PRELOAD:
        importlib.import_module(name)
    for name in GRADING_PRELOAD:
        importlib.import_module(f"{__package__}.{name}")
    if zygote == "lean":
        return
    stack = MATH_PRELOAD + (DATA_PRELOAD if zygote == "data" else ())
    for name in stack + (FULL_PRELOAD if full else ()):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if full and zygote == "data":
        preload_matplotlib()
    exercise()


# CPython 3.12 never writes the reference count of an "immortal" object (PEP 683): one whose
# count is this value, as the interpreter's own static objects have.
_IMMORTAL_REFCOUNT = 0xFFFFFFFF


def immortalize_heap() -> int:
    """Make every object of the preloaded heap immortal; the number of objects changed.

    A forked child that merely uses a preloaded object (a sympy singleton, a cached expression,
    a numpy ufunc) increments and decrements its reference count, which writes to the page
    that holds it: a copy-on-write fault, a few microseconds each, thousands per sympy call.
    Immortal objects are never written for that, and never freed: the zygote keeps its heap for
    life anyway (gc.freeze), and a child's new objects stay mortal. Done only where the
    representation is the one known here (64-bit CPython 3.12).
    """
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 12):
        return 0
    if sys.maxsize <= 2**32:
        return 0
    changed = 0
    for obj in heap_objects():
        refcount = ctypes.c_ssize_t.from_address(id(obj))
        if refcount.value & 0x80000000 == 0:  # not immortal already
            refcount.value = _IMMORTAL_REFCOUNT
            changed += 1
    return changed


def heap_objects() -> Iterator[object]:
    """Every object reachable from those the collector tracks, each once (code objects' parts
    included, which the collector does not traverse)."""
    import gc

    pending: list[Any] = gc.get_objects()
    # Made after the snapshot, so that it is not in it (immortalize_heap would make it
    # immortal too), and a bitmap, not a set of addresses: a set's ints would be as many
    # objects again, whose freeing leaves arenas emptied and the heap fragmented.
    seen = _AddressBitmap()
    while pending:
        obj = pending.pop()
        if seen.test_and_set(id(obj)):
            continue
        yield obj
        if type(obj) is types.CodeType:
            # Their constants (which every LOAD_CONST references), names and nested code.
            pending.extend(_parts_of_code(obj))
        else:
            pending.extend(gc.get_referents(obj))


class _AddressBitmap:
    """A set of object addresses: one bit per 16 bytes of address space, 8 KiB per MiB of it.

    Two objects start at least 16 bytes apart (each holds a reference count and a type), so
    each has a bit of its own.
    """

    def __init__(self) -> None:
        self._chunks: dict[int, bytearray] = {}

    def test_and_set(self, address: int) -> bool:
        """Whether the address was in the set; it is now."""
        chunk = self._chunks.get(address >> 20)
        if chunk is None:
            chunk = self._chunks[address >> 20] = bytearray(1 << 13)
        index = (address & 0xFFFFF) >> 4
        byte, bit = index >> 3, 1 << (index & 7)
        if chunk[byte] & bit:
            return True
        chunk[byte] |= bit
        return False


def _parts_of_code(code: types.CodeType) -> tuple[object, ...]:
    """The objects a code object holds (attributes that are stored, not computed anew)."""
    return (
        code.co_consts, code.co_names, code.co_filename, code.co_name, code.co_qualname,
        code.co_linetable, code.co_exceptiontable,
    )  # fmt: skip


_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25
_HUGE_PAGE = 2 << 20


def _huge_pages_inside(low: int, high: int) -> tuple[int, int]:
    """The 2 MiB-aligned range inside [low, high) (empty when none fits)."""
    return -(-low // _HUGE_PAGE) * _HUGE_PAGE, high // _HUGE_PAGE * _HUGE_PAGE


def huge_pages() -> int:
    """Back the preloaded heap with transparent huge pages; the number of 2 MiB pages made.

    fork copies one page-table entry per present page of the heap and the child's exit
    zaps them again: for a 150 MiB preloaded heap that was most of the CPU of a trivial run
    (fork 3.2 ms, child with its exit 4.6 ms, measured outside the jail). A huge page is one
    entry (0.9 ms, 1.8 ms). A child's first write to one still copies only 4 KiB (the kernel
    splits the child's mapping), and nothing is shared between runs that was not before: the
    pages stay copy-on-write. MADV_COLLAPSE (Linux 6.1) works whatever the system's THP
    default is, except "never"; where it is refused, the heap simply stays on small pages.
    """
    if not sys.platform.startswith("linux"):
        return 0
    madvise = _libc().madvise
    made = 0
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        # Anonymous private writable mappings: the interpreter's arenas and malloc's heap.
        if not fields[1].startswith("rw") or (len(fields) > 5 and fields[5] != "[heap]"):
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        start, end = _huge_pages_inside(low, high)
        if end - start < _HUGE_PAGE:
            continue
        madvise(start, end - start, _MADV_HUGEPAGE)
        for address in range(start, end, _HUGE_PAGE):
            made += madvise(address, _HUGE_PAGE, _MADV_COLLAPSE) == 0
    return made


_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_MAP_PRIVATE_ANONYMOUS = 0x02 | 0x20
_MREMAP_MAYMOVE_FIXED = 1 | 2


def interpreter_code_on_huge_pages() -> int:
    """Copy the interpreter's machine code onto huge pages of this process's own; the number of
    2 MiB pages it now lies on.

    fork copies no page-table entries of a file's mapping that nothing wrote, so every child
    faults libpython's code in again, a fault per 64 KiB it runs (the kernel maps 16 pages
    around each), and its exit unmaps them: a print(1) child took 33 such faults, 0.2 ms of
    fork and child together. An anonymous copy on huge pages is one entry per 2 MiB that
    fork copies and no child faults on. Only the 2 MiB-aligned ranges that lie wholly in the
    library's read-only mappings are copied: its headers, its code and the start of its
    read-only data, all executable then (one huge page has one protection). The copy takes
    the file's place in one mremap, which changes nothing else: the bytes at each address are
    the same. Each child's pages stay copy-on-write: a program that writes its own copy of the
    code (after an mprotect of its own) writes nothing a later run is forked from. Where a step
    is refused (no transparent huge pages, a policy against new executable memory), the
    library's own mapping stays.
    """
    if not sys.platform.startswith("linux") or sys.implementation.name != "cpython":
        return 0
    return sum(
        _copy_onto_huge_pages(_libc(), start, end) for start, end in _interpreter_code_ranges()
    )


def _interpreter_code_ranges() -> list[tuple[int, int]]:
    """The 2 MiB-aligned ranges inside the read-only mappings of the file that holds the
    interpreter's code (libpython, or the executable where it is linked in)."""
    code = ctypes.cast(ctypes.pythonapi.PyObject_Repr, ctypes.c_void_p).value or 0
    spans: list[tuple[int, int, list[str]]] = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) > 5:  # a file's mapping
                low, high = (int(x, 16) for x in fields[0].split("-"))
                spans.append((low, high, fields))
    holder = next((f[3:5] for low, high, f in spans if low <= code < high), None)
    runs: list[list[int]] = []
    for low, high, fields in spans:
        if fields[3:5] != holder or "w" in fields[1]:
            continue
        if runs and runs[-1][1] == low:
            runs[-1][1] = high
        else:
            runs.append([low, high])
    aligned = [_huge_pages_inside(low, high) for low, high in runs]
    return [(start, end) for start, end in aligned if end > start]


def _copy_onto_huge_pages(libc: ctypes.CDLL, start: int, end: int) -> int:
    """Replace [start, end) with an executable copy on huge pages; the number made (0: refused,
    and nothing changed)."""
    size = end - start
    reserved = size + _HUGE_PAGE  # room to align the copy
    rw = _PROT_READ | _PROT_WRITE
    raw = libc.mmap(None, reserved, rw, _MAP_PRIVATE_ANONYMOUS, -1, 0)
    if raw in (None, ctypes.c_void_p(-1).value):
        return 0
    copy = _huge_pages_inside(raw, raw + reserved)[0]
    for low, high in ((raw, copy), (copy + size, raw + reserved)):
        if high > low:
            libc.munmap(low, high - low)
    libc.madvise(copy, size, _MADV_HUGEPAGE)
    ctypes.memmove(copy, start, size)
    collapsed = all(
        libc.madvise(address, _HUGE_PAGE, _MADV_COLLAPSE) == 0
        for address in range(copy, copy + size, _HUGE_PAGE)
    )
    if (
        collapsed
        and libc.mprotect(copy, size, _PROT_READ | _PROT_EXEC) == 0
        and libc.mremap(copy, size, size, _MREMAP_MAYMOVE_FIXED, start) == start
    ):
        return size // _HUGE_PAGE
    libc.munmap(copy, size)
    return 0


class _ArenaAllocator(ctypes.Structure):
    """CPython's PyObjectArenaAllocator: where the small-object allocator gets its arenas."""

    _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]


_MALLOC_MAPS_ABOVE = 4 << 20
"""glibc's malloc maps each request above its threshold (128 KiB at first) on its own, and
raises the threshold to the size of the largest such block freed since (up to 32 MiB): one
block of this size, freed, keeps an arena's requests in the heap."""


@contextlib.contextmanager
def contiguous_arenas() -> Iterator[bool]:
    """Inside: the interpreter's new arenas are taken from malloc's heap (the program break's
    mapping), one after the other, so that huge_pages can collapse them whole; yields whether.

    The small-object allocator maps each 1 MiB arena on its own, and the kernel puts it in the
    first gap it finds, often between the mappings of shared libraries an import has just
    loaded. There no 2 MiB range lies within one mapping and nothing can collapse it: every
    fork copies one page-table entry per page of it and every child's exit drops them again,
    0.03 ms per MiB here; a huge page, even one whose mapping was split since, costs a tenth
    of that or less (scripts/fork_cost.py). With 17-20 MiB left on 4 KiB pages so, against 7-9
    with this: 0.13-0.32 ms less per call.

    The arena allocator (PyObject_SetArenaAllocator) is set to libc's aligned_alloc with the
    pool size as its context: CPython calls alloc(ctx, size), which is aligned_alloc's
    (alignment, size). The thread's frame stack takes its chunks there too. malloc serves
    them from its heap once its threshold for mapping a block on its own is above an arena:
    one larger block freed raises it, as malloc does for itself whenever a program frees one
    (children inherit the raised threshold, as a process does after its first such free).
    Freeing does nothing (getpid, which ignores its arguments): an arena emptied while inside
    stays, which few do during a preload. Leaving puts the default back for everything after,
    the zygote's own arenas and its children's; an arena of the preload freed later is
    unmapped as any other (it is page-aligned, and malloc never reads the inside of a block it
    handed out).
    """
    if not sys.platform.startswith("linux") or sys.implementation.name != "cpython":
        yield False
        return
    libc, api = _libc(), ctypes.pythonapi
    libc.free(libc.malloc(_MALLOC_MAPS_ABOVE))
    ours = _ArenaAllocator(
        _POOL_BYTES,
        ctypes.cast(libc.aligned_alloc, ctypes.c_void_p).value,
        ctypes.cast(libc.getpid, ctypes.c_void_p).value,
    )
    default = _ArenaAllocator()
    api.PyObject_GetArenaAllocator(ctypes.byref(default))
    api.PyObject_SetArenaAllocator(ctypes.byref(ours))
    try:
        yield True
    finally:
        api.PyObject_SetArenaAllocator(ctypes.byref(default))


_FILLERS: list[object] = []
"""The objects fill_allocator() made, kept for the zygote's life."""
_POOL_BYTES = 16 << 10
"""CPython 3.12's small-object pool (with its radix tree, on 64-bit Linux)."""
_POOL_HEADER_BYTES = 48
_LARGEST_BLOCK = 512


def fill_allocator(passes: int = 3) -> int:
    """Take every free block and every unused pool of the small-object allocator; the number
    of blocks taken.

    The preloaded heap's pools are left with free blocks scattered over their pages, and its
    arenas with unused pools. A child allocates from those first, so its new objects land a
    few per page and each page costs a copy-on-write fault; the zygote's own allocations, once
    it serves, write there too and split the huge pages that page. With all of them taken,
    every later allocation, the zygote's and its children's, goes to arenas mapped after the
    preload. The blocks hold immutable objects nothing else refers to: no child reads or
    writes them. CPython only, where the allocator reports its pools; a few passes, since
    filling allocates a little itself.
    """
    taken = 0
    for _ in range(passes):
        stats = _allocator_stats()
        if stats is None:
            break
        free_blocks, unused_pools = stats
        wanted = dict(free_blocks)
        per_pool = (_POOL_BYTES - _POOL_HEADER_BYTES) // _LARGEST_BLOCK
        wanted[_LARGEST_BLOCK] = wanted.get(_LARGEST_BLOCK, 0) + unused_pools * per_pool
        this_pass = 0
        for size, count in wanted.items():
            make = _filler_of_size(size)
            if make is not None and count:
                # One allocation per object and no temporaries: a freed one would free a block.
                _FILLERS.extend(make() for _ in itertools.repeat(None, count))
                this_pass += count
        taken += this_pass
        if this_pass == 0:
            break
    return taken


def _filler_of_size(size: int) -> Callable[[], object] | None:
    """A maker of new objects whose allocation is `size` bytes (a block size), or None."""
    if size == 16:
        return object
    if size == 32:
        return float  # float() is a new 0.0 each time
    length = size - _BYTES_OVERHEAD
    if length < 2:  # bytes of length 0 and 1 are shared singletons
        return None
    return lambda: bytes(length)


_BYTES_OVERHEAD = sys.getsizeof(b"")


def _allocator_report() -> str | None:
    """CPython's report on its small-object allocator (sys._debugmallocstats), or None.

    Caught in a memfd, not a temporary file: tempfile imports shutil, which loads the zlib, bz2
    and lzma modules and two system libraries, 27 mappings of the lean zygote that every fork
    copies and every exit tears down (about 1.5 us each per call), for programs that never asked
    for them.
    """
    report = getattr(sys, "_debugmallocstats", None)
    if report is None:
        return None
    try:
        capture = os.memfd_create("allocator-report", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        return None
    try:
        saved = os.dup(2)
        try:
            os.dup2(capture, 2)
            report()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        size = os.fstat(capture).st_size
        return os.pread(capture, size, 0).decode("ascii", errors="replace")
    except OSError:
        return None
    finally:
        os.close(capture)


def _allocator_stats() -> tuple[dict[int, int], int] | None:
    """({block size: free blocks in its used pools}, unused pools) from CPython's allocator
    report, or None where there is none to read."""
    text = _allocator_report()
    if text is None:
        return None
    free_blocks: dict[int, int] = {}
    unused_pools = None
    in_table = False
    for line in text.splitlines():
        fields = line.split()
        if fields[:2] == ["class", "size"]:
            in_table = True
        elif in_table and len(fields) == 5 and all(f.isdigit() for f in fields):
            free_blocks[int(fields[1])] = int(fields[4])
        elif in_table and free_blocks and len(fields) != 5:
            in_table = False
        if fields[1:3] == ["unused", "pools"] and fields[0].isdigit():
            unused_pools = int(fields[0])
    if not free_blocks or unused_pools is None:
        return None
    return free_blocks, unused_pools


def exercise() -> None:
    """Typical math tool-call work: fills the libraries' caches and touches their memory."""
    try:
        import numpy as np

        a = np.arange(16, dtype=float).reshape(4, 4) + np.eye(4)
        np.linalg.solve(a, np.ones(4))
        np.linalg.eigvals(a)
        np.random.default_rng(0).random(8).sum()
    except ImportError:
        pass
    try:
        import sympy as sp

        x, y = sp.symbols("x y")
        sp.solve(x**2 - 5 * x + 6, x)
        sp.solve([x + y - 3, x - y - 1], [x, y])
        sp.simplify(sp.sin(x) ** 2 + sp.cos(x) ** 2)
        sp.factor(x**3 - 1)
        sp.expand((x + 1) ** 5)
        sp.integrate(x**2, (x, 0, 1))
        sp.diff(sp.exp(x) * sp.sin(x), x)
        sp.limit(sp.sin(x) / x, x, 0)
        sp.Matrix([[1, 2], [3, 4]]).inv()
        sp.nsimplify(0.5)
        sp.Rational(1, 3) + sp.sqrt(2)
        sp.latex(sp.sqrt(x) / 2)
        sp.isprime(97)
        sp.factorint(360)
        sp.N(sp.pi, 20)
    except ImportError:
        pass
    try:
        import mpmath

        mpmath.mp.dps = 15
        mpmath.quad(mpmath.sin, [0, 1])
    except ImportError:
        pass
    pd = sys.modules.get("pandas")  # exercised only where the preload imported it
    if pd is not None:
        frame = pd.DataFrame({"a": [1, 2, 2], "b": [0.5, 1.5, 2.5], "c": ["x", "y", "z"]})
        frame.groupby("a")["b"].sum()
        frame.describe()
        repr(frame)
        frame._repr_html_()  # a cell's value is displayed as its HTML table


def prepare_heap(
    full: bool = False,
    contiguous: bool = True,
    immortal: bool = True,
    fill: bool = True,
    huge_code: bool = True,
    zygote: Zygote = "data",
) -> int:
    """Preload, and shape the heap for forking: arenas in one mapping (contiguous_arenas),
    objects immortal, frozen, the allocator's gaps taken, huge pages for the heap and the
    interpreter's code; the number of objects made immortal. The flags leave a step out, for
    scripts/fault_anatomy.py to measure it."""
    import gc

    changed = 0
    with contiguous_arenas() if contiguous else contextlib.nullcontext(False):
        preload(full, zygote)
        gc.collect()
        if immortal:
            changed = immortalize_heap()
        gc.collect()
        gc.freeze()  # keep the preloaded heap's pages shared with the children (no gc writes)
        if fill:
            fill_allocator()
    huge_pages()
    if huge_code:
        interpreter_code_on_huge_pages()
    return changed
