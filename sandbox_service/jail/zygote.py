"""The in-jail zygote: PID 1 of one nsjail, forks one child per execution.

This file runs *inside* the jail under the jailed interpreter, with the standard library and the
preloaded scientific stack only; it must not import sandbox_service. The worker imports it too,
for the framing functions, so importing it does nothing.

Protocol (a Unix stream socket on the descriptor named by --control-fd): length-prefixed JSON
frames of the typed messages in protocol.py (Ready, Control, RunRequest, RunReply), loaded by
path from the file mounted next to this one. A RunRequest carries four file descriptors (code
memfd, stdin, stdout and stderr pipe write ends) in SCM_RIGHTS on its first byte.

    zygote -> worker  Ready
    worker -> zygote  Control("serve")  (once the zygote is in the slot's cgroups)
    worker -> zygote  RunRequest ...    zygote -> worker  RunReply ...
    worker -> zygote  Control("exit")

The program never holds a descriptor of this path: the standby that takes a request tells the
zygote on a private pipe and closes it before the program starts; the exit status, signal and
CPU time are then the kernel's (wait4 on the program's process).

Why PID 1: the kernel ignores SIGKILL sent to a PID namespace's init from inside it, and
`kill(-1, SIGKILL)` from init reaches every other process of the namespace, daemonised
grandchildren included. The zygote is made non-dumpable, so its /proc files belong to root and
its memory cannot be read or written; seccomp denies ptrace and prlimit on other processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import importlib
import io
import itertools
import json
import math
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys
import time
import traceback
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

if TYPE_CHECKING or __package__:  # the worker's side
    from . import protocol
else:  # inside the jail, run as a script: protocol.py is mounted next to this file
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "rl_sandbox_protocol", os.path.join(os.path.dirname(__file__), "protocol.py")
    )
    assert _spec is not None and _spec.loader is not None
    protocol = importlib.util.module_from_spec(_spec)
    sys.modules["rl_sandbox_protocol"] = protocol  # dataclasses look their module up
    _spec.loader.exec_module(protocol)

WORK_DIR = "/home/sandbox"
SCRATCH_DIRS = (WORK_DIR, "/tmp", "/mnt", "/dev/shm")
_SCRATCH_PREFIXES = tuple(top + "/" for top in SCRATCH_DIRS)
PR_SET_DUMPABLE = 4
WARM_UP_AFTER_IDLE_S = 0.02
REAP_DEADLINE_S = 10.0
_MAX_SETUP_ERROR_CHARS = 4000
"""Under what a RunReply's setup_error may hold (protocol.py): a long path in an error message
must not make the answer invalid."""
CPU_LIMIT_REACHED_AT = 0.75
"""The share of its CPU-time limit a process must have used for a SIGXCPU to be the limit's.
The kernel checks RLIMIT_CPU against CPU time counted in scheduler ticks, which ran ahead of
the rusage wait4 reports (0.90 s of rusage at a 1 s limit on a loaded VM, measured)."""


def cpu_limit_reached(cpu_s: float, limit_s: float) -> bool:
    """Whether a process that used `cpu_s` (rusage) had reached a CPU-time limit of `limit_s`."""
    return limit_s > 0 and cpu_s >= limit_s * CPU_LIMIT_REACHED_AT


MAX_TAKEN_LINE_BYTES = protocol.MAX_FRAME_BYTES + (1 << 16)
"""A standby's report of the request it took carries the request's fetch list, which came in
a frame: never longer than one, whatever a valid request holds."""
MAX_PENDING_SIGNALS = 256
"""RLIMIT_SIGPENDING of the whole jail. Queued signals are counted per user up the chain of user
namespaces: each jail's count is also charged to the host user that started nsjail (root), under
that user's own limit, so a program queueing signals without bound made the host's root unable
to queue a real-time signal (sigqueue: EAGAIN) while it ran (tests/jail/test_redteam.py)."""


# --- framing, shared with the worker side ---------------------------------------------------


ABORT = "abort"
"""The op of the frame the worker writes during a run to abort it (its client went away). One
that arrives after the run's answer (the two crossed) is read and ignored."""


def send_frame(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one length-prefixed JSON message, with file descriptors on its first byte."""
    data = protocol.encode_frame(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)


def recv_frame(
    sock: socket.socket, max_fds: int = 0, max_bytes: int = protocol.MAX_FRAME_BYTES
) -> tuple[dict[str, Any], list[int]]:
    """Receive one message and the descriptors sent with it; EOFError when the peer is gone,
    ProtocolError for a frame over `max_bytes` or not a JSON object."""
    fds: list[int] = []
    header = protocol.HEADER
    if max_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, header.size, max_fds)
    else:
        head = sock.recv(header.size)
    if not head:
        raise EOFError("control socket closed")
    try:
        head += _recv_exact(sock, header.size - len(head))
        (length,) = header.unpack(head)
        if length > max_bytes:
            raise protocol.ProtocolError(f"frame of {length} bytes exceeds {max_bytes}")
        return protocol.decode_body(_recv_exact(sock, length)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            raise EOFError("control socket closed mid-frame")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    """libc, with the prototypes of the memory calls the zygote makes (pointers are 64-bit)."""
    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        size_t, void_p, c_int = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
        libc.mmap.restype = libc.mremap.restype = libc.malloc.restype = void_p
        libc.mmap.argtypes = [void_p, size_t, c_int, c_int, c_int, ctypes.c_long]
        libc.mremap.argtypes = [void_p, size_t, size_t, c_int, void_p]
        libc.mprotect.argtypes = libc.madvise.argtypes = [void_p, size_t, c_int]
        libc.munmap.argtypes = [void_p, size_t]
        libc.malloc.argtypes = [size_t]
        libc.free.restype, libc.free.argtypes = None, [void_p]
        _LIBC.append(libc)
    return _LIBC[0]


_LIBC_FORK: list[Any] = []


def fork_lean() -> int:
    """fork(2) from this single-threaded process, without the interpreter's at-fork work.

    os.fork() also runs CPython's fork handling: it re-creates the runtime's locks, the GIL and
    the threads' states, and calls the handlers modules registered (threading's, logging's,
    random's, asyncio's). In a process with one thread that holds none of those locks, all of
    that leaves the child as it was, at about 0.5-1 ms of CPU and 170 copy-on-write faults per
    child. What matters of it is done by hand: the zygote reseeds random, with numpy's and
    sympy's generators, before each standby's fork (_reseed_random), and the main thread's
    native id is set here. The GIL stays held across
    the call (PyDLL). With a second Python thread, this is os.fork(), which deletes its state.
    """
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() != 1:
        return os.fork()
    if not _LIBC_FORK:
        libc_fork = ctypes.PyDLL(None, use_errno=True).fork
        libc_fork.restype, libc_fork.argtypes = ctypes.c_int, []
        _LIBC_FORK.append(libc_fork)
    pid: int = _LIBC_FORK[0]()
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    if pid == 0 and threading is not None:
        threading.main_thread()._set_native_id()
    return pid


# --- preloading -----------------------------------------------------------------------------

STDLIB_PRELOAD = (
    *("math", "cmath", "fractions", "decimal", "itertools", "functools", "collections"),
    *("heapq", "bisect", "statistics", "random", "re", "json", "string", "datetime", "time"),
    *("typing", "dataclasses", "copy", "operator", "textwrap", "io", "traceback", "struct"),
    *("array", "enum", "numbers", "hashlib", "base64", "pprint", "threading", "subprocess"),
)


MATH_PRELOAD = ("numpy", "sympy", "mpmath")
"""What the math tool calls (most calls) import; `exercise` warms them."""
FULL_PRELOAD = ("scipy.optimize", "scipy.integrate", "scipy.linalg", "scipy.special")
"""scipy's modules a math tool call uses, preloaded only with --preload-full: they double the
zygote's heap, and every call pays for a larger heap in its fork and exit."""


def preload(full: bool = False) -> None:
    """Import and exercise the libraries tool calls use, so forked children skip first-use costs."""
    for name in STDLIB_PRELOAD:
        importlib.import_module(name)
    for name in MATH_PRELOAD + (FULL_PRELOAD if full else ()):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if full:
        preload_matplotlib()
    exercise()


class _AfterImport:
    """A meta path finder that adjusts a module right after the import system executed it.

    Used for matplotlib, imported on demand: its cache directory is the read-only font list
    the worker built (no font scan in a run whose home is fresh), and pyplot's `show` displays
    figures. It finds nothing itself; a program may remove it, which changes only its own run.
    """

    def __init__(self, hooks: dict[str, Any]) -> None:
        self._hooks = hooks

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        hook = self._hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run_module(module)
            hook(module)

        loader.exec_module = exec_module  # this module's own loader object
        return spec


def install_matplotlib_hooks(cache_dir: str | None) -> None:
    """Before any import of matplotlib: its font list from `cache_dir`, pyplot's show."""

    def on_matplotlib(module: types.ModuleType) -> None:
        if cache_dir is not None:
            setattr(module, "get_cachedir", lambda: cache_dir)  # noqa: B010

    def on_pyplot(module: types.ModuleType) -> None:
        setattr(module, "show", show_figures)  # noqa: B010

    hooks = {"matplotlib": on_matplotlib, "matplotlib.pyplot": on_pyplot}
    sys.meta_path.insert(0, _AfterImport(hooks))


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
    """CPython's report on its small-object allocator (sys._debugmallocstats), or None."""
    report = getattr(sys, "_debugmallocstats", None)
    if report is None:
        return None
    import tempfile

    try:
        saved = os.dup(2)
        with tempfile.TemporaryFile() as capture:
            try:
                os.dup2(capture.fileno(), 2)
                report()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            capture.seek(0)
            return capture.read().decode("ascii", errors="replace")
    except OSError:
        return None


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


_LOADAVG_FD = [-1]
"""The host's /proc/loadavg, passed by the worker (the jail's /proc has no host-wide files)."""


def host_busy() -> bool:
    """Whether the host's CPUs are all taken now: idle-time work would then slow someone's run.

    Counts the tasks runnable at this instant (the 4th field of /proc/loadavg, which is not
    namespaced), less the caller; the load averages lag by a minute.
    """
    try:
        text = os.pread(_LOADAVG_FD[0], 256, 0).decode()
        runnable = int(text.split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return True
    return runnable - 1 >= (os.cpu_count() or 1)


# --- rich outputs: displays (figures, a cell's value) and the uncaught exception -------------

OUTPUTS_FILE = "/tmp/.rl-sandbox-outputs.json"
"""Where the program's process leaves its rich outputs for the zygote, once the program (or
cell) is over; the zygote reads it with a bound, validates it, and removes it."""
_OUTPUTS: dict[str, Any] = {"display": [], "error": None}
"""What the program in this process has displayed, and the exception that ended it."""


def preload_matplotlib() -> None:
    """pyplot on Agg, its font list loaded and one figure rendered, once in the zygote.

    `plt.show()` displays the open figures and closes them, as Jupyter's inline backend does
    (Agg alone would only warn); install_matplotlib_hooks does the same for an import in a run.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    plt.show = show_figures
    _forget_zygote_config_dir(matplotlib)
    figure = plt.figure()
    figure.gca().plot([0, 1], [0, 1], label="warm-up")
    figure.gca().set_title("warm-up")
    figure.gca().legend()
    _png_of(figure)
    plt.close("all")
    # The fonts that rendering opened read their files through descriptors, which a standby
    # closes before the program starts (_close_all_but): a program's text would be read
    # through a closed (or reused) descriptor, "failed to load glyph". Each run opens its own.
    font_manager = sys.modules.get("matplotlib.font_manager")
    get_font = getattr(font_manager, "_get_font", None)
    if get_font is not None and hasattr(get_font, "cache_clear"):
        get_font.cache_clear()


def _forget_zygote_config_dir(matplotlib: Any) -> None:
    """The zygote cannot write the program's home, so matplotlib made itself a temporary config
    directory and registered its removal at exit: in a child (another uid, another /tmp) that
    removal would fail on stderr. The path stays cached, and names nothing: matplotlib only
    reads a configuration there, and its cache directory is the worker's font list."""
    import atexit
    import shutil

    atexit.unregister(shutil.rmtree)
    get_configdir = getattr(matplotlib, "get_configdir", None)
    path = str(get_configdir()) if get_configdir is not None else ""
    if path.startswith("/tmp/matplotlib-"):
        shutil.rmtree(path, ignore_errors=True)


def show_figures(*_args: Any, **_kwargs: Any) -> None:
    """Display every open matplotlib figure as image/png, then close them all."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for number in plt.get_fignums():
        _OUTPUTS["display"].append({"image/png": _png_of(plt.figure(number))})
    plt.close("all")


def _png_of(figure: Any) -> str:
    import base64
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode()


def display_value(value: Any) -> None:
    """A cell's last expression: printed, as in a notebook, and displayed as text/plain."""
    text = repr(value)
    print(text)
    _OUTPUTS["display"].append({"text/plain": text})


def record_error(exc: BaseException, tb: types.TracebackType | None) -> None:
    """The exception that ended the program or cell, in Jupyter's terms."""
    _OUTPUTS["error"] = {
        "ename": type(exc).__name__,
        "evalue": str(exc),
        "traceback": traceback.format_exception(type(exc), exc, tb),
    }


def leave_outputs() -> None:
    """In the program's process, after it ran: its displays (open figures included) and error
    into OUTPUTS_FILE, within the size the zygote accepts; cleared for the next cell."""
    try:
        show_figures()
    except Exception:
        traceback.print_exc()  # a figure that cannot render is the program's error, not ours
    display, error = _OUTPUTS["display"], _OUTPUTS["error"]
    _OUTPUTS["display"], _OUTPUTS["error"] = [], None
    if not display and error is None:
        return
    kept, size = [], 0
    for item in display:
        size += sum(len(v) for v in item.values())
        if size > protocol.MAX_OUTPUTS_BYTES // 2:
            break
        kept.append(item)
    body = json.dumps({"display": kept, "error": error}).encode()
    if len(body) > protocol.MAX_OUTPUTS_BYTES:
        body = json.dumps({"display": [], "error": error}).encode()[: protocol.MAX_OUTPUTS_BYTES]
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        fd = os.open(OUTPUTS_FILE, flags, 0o600)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def take_outputs() -> protocol.Outputs:
    """The zygote's side: the run's outputs file, read without following links or blocking,
    bounded and validated (the program could have written anything there), then removed."""
    try:
        fd = _open_beneath(OUTPUTS_FILE, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return protocol.Outputs()
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return protocol.Outputs()
            data = f.read(protocol.MAX_OUTPUTS_BYTES + 1)
        if len(data) > protocol.MAX_OUTPUTS_BYTES:
            return protocol.Outputs()
        return protocol.Outputs.from_wire(protocol.decode_body(data))
    except (OSError, protocol.ProtocolError):
        return protocol.Outputs()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(OUTPUTS_FILE)


# --- the child: becomes the user's program ---------------------------------------------------


def _set_limits(limits: protocol.RunLimits) -> None:
    cpu = limits.cpu_time_s
    fsize = limits.max_file_size_mb * 1024 * 1024
    wanted = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_FSIZE: (fsize, fsize),
        resource.RLIMIT_NOFILE: (limits.max_open_files,) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for which, (soft, hard) in wanted.items():
        # Never above the jail's own hard limit, which nsjail set and nothing can raise.
        _, jail_hard = resource.getrlimit(which)
        if jail_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, jail_hard), min(hard, jail_hard)
        resource.setrlimit(which, (soft, hard))


_StdStreams = tuple[io.TextIOWrapper, io.TextIOWrapper, io.TextIOWrapper]

_CHILDREN_STD_STREAMS: list[_StdStreams] = []
"""The text streams a program gets on descriptors 0-2 (make_children_std_streams), made once by
the zygote and never used by it: each standby installs its own copy-on-write copy."""


def _std_streams() -> _StdStreams:
    """New text streams over descriptors 0-2, as the interpreter makes for a program."""
    return (
        open(0, encoding="utf-8", errors="strict", closefd=False),
        open(1, "w", encoding="utf-8", errors="strict", closefd=False),
        open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1),
    )


def make_children_std_streams() -> None:
    """Make the streams every standby installs, over a pipe on descriptors 0-2 for the while.

    A stream learns what its descriptor is when it is made (seekable, a terminal, its block
    size) and keeps it; a program's descriptors are pipes, so these are made over one (the
    zygote's own, a log file, would leave a program with a stdout that claims to seek), and the
    zygote's descriptors are put back. Made once here instead of in every child: about 50
    copy-on-write faults and three streams' construction less per run.
    """
    saved = [_dup_above_std(fd) for fd in (0, 1, 2)]
    pipe = os.pipe()
    read_end, write_end = (fcntl.fcntl(end, fcntl.F_DUPFD_CLOEXEC, 3) for end in pipe)
    for end in pipe:
        os.close(end)
    try:
        for fd, end in ((0, read_end), (1, write_end), (2, write_end)):
            os.dup2(end, fd)
        streams = _std_streams()
        for stream in streams:
            stream.seekable()  # learnt now, over the pipe
        _CHILDREN_STD_STREAMS[:] = [streams]
    finally:
        for fd, original in enumerate(saved):
            if original is None:
                os.close(fd)
            else:
                os.dup2(original, fd)
                os.close(original)
        os.close(read_end)
        os.close(write_end)


def _dup_above_std(fd: int) -> int | None:
    """A duplicate of fd numbered 3 or more (not in a free slot of 0-2), or None if fd is not
    open."""
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        return None


def _install_std_streams(streams: _StdStreams) -> None:
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams  # type: ignore[misc]


def _exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def prepare_child() -> dict[str, Any]:
    """In a pre-forked child, before any request: everything that does not depend on it.

    Done while the slot is idle, so the copy-on-write page faults of this work stay off the
    execution's critical path; returns the fresh __main__ namespace.
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # Streams over fds 0-2; the request's pipes are dup2'd under them.
    _install_std_streams(_CHILDREN_STD_STREAMS[0] if _CHILDREN_STD_STREAMS else _std_streams())
    namespace = _fresh_main()
    # Touch the compile, exec and print paths once.
    exec(compile("_ = repr([1, 'a', 2.0])", "<warm-up>", "exec"), {"__builtins__": __builtins__})
    return namespace


def run_child(code_fd: int, limits: protocol.RunLimits, namespace: dict[str, Any]) -> None:
    """In the child, once its request came: limits, the program, its exit. Never returns.

    Nothing here reports to the zygote: from the first line of the program on, this process is
    the program's, and the zygote learns how it ended from the kernel alone.
    """
    status = 1
    try:
        with os.fdopen(code_fd, "rb") as f:
            source = f.read().decode("utf-8", errors="surrogateescape")
        _set_limits(limits)
        status = _run_source(source, namespace)
    except BaseException:
        try:
            traceback.print_exc()
        finally:
            status = 1
    finally:
        with contextlib.suppress(BaseException):
            leave_outputs()
        status = _flush_and_finish(status)
        # The program's pipes are closed first, so the worker sees their end without waiting
        # for the kernel's teardown of this address space.
        for fd in (0, 1, 2):
            with contextlib.suppress(OSError):
                os.close(fd)
        os._exit(status)


_MT_KEY_WORDS = 624
_MT_KEY_BYTES = 4 * _MT_KEY_WORDS


def _reseed_random() -> None:
    # A forked child inherits the PRNG states of the process it was forked from: without this,
    # every execution would draw the same numbers. `random` reseeds itself in os.fork's
    # handlers, which fork_lean skips; numpy's legacy global state never does, nor does sympy's
    # own generator (sympy.randprime, its randomised tests), seeded once at its import. The
    # zygote calls this before each standby's fork (the child forked before it never sees the
    # new states), where the code is warm: in a fresh child it cost about 70 copy-on-write
    # faults.
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        # A whole Mersenne Twister key from the kernel, as seed() would make, without its
        # SeedSequence (0.32 -> 0.19 ms of a child's CPU); no Gaussian is left cached.
        key = np.frombuffer(os.urandom(_MT_KEY_BYTES), dtype=np.uint32)
        np.random.set_state(("MT19937", key, _MT_KEY_WORDS, 0, 0.0))
    sympy_random = sys.modules.get("sympy.core.random")
    if sympy_random is not None:
        sympy_random.rng.seed()


_SEEDED_GENERATORS: dict[str, Callable[[types.ModuleType, int], None]] = {
    "random": lambda module, seed: module.seed(seed),  # mpmath draws from it too
    "numpy.random": lambda module, seed: module.seed(seed),  # the global state scipy uses
    "sympy.core.random": lambda module, seed: module.rng.seed(seed),
}
"""The modules whose global generators a seed seeds, and how."""
_SEED: list[int] = []
"""The seed of the current run or cell, for a generator module it imports later."""


def seed_random(seed: int | None) -> None:
    """Seed every generator the jail preloads from `seed` (None: forget the last one), and
    those of SEEDED_GENERATORS imported later in the run. Generators a program makes from
    fresh entropy (numpy's default_rng(), os.urandom, secrets, uuid4) stay unseeded:
    docs/jail.md."""
    _SEED[:] = [] if seed is None else [seed]
    if seed is None:
        return
    for name, apply in _SEEDED_GENERATORS.items():
        module = sys.modules.get(name)
        if module is not None:
            apply(module, seed)


def install_seed_hooks() -> None:
    """Before any import of the generator modules: seed them as they are imported, when the
    run has a seed (cold mode imports them in the program, after the seed is known)."""

    def hook(name: str) -> Callable[[types.ModuleType], None]:
        def seed_on_import(module: types.ModuleType) -> None:
            if _SEED:
                _SEEDED_GENERATORS[name](module, _SEED[0])

        return seed_on_import

    sys.meta_path.insert(0, _AfterImport({name: hook(name) for name in _SEEDED_GENERATORS}))


def _fresh_main() -> dict[str, Any]:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    sys.path.insert(0, "")  # as `python -c`: the working directory is importable
    return main.__dict__


def _run_source(source: str, namespace: dict[str, Any] | None = None, cell: bool = False) -> int:
    """Run a program (or a notebook cell) like the interpreter would; return its exit status."""
    if namespace is None:
        namespace = _fresh_main()
    _forget_scratch_listings()
    try:
        if cell:
            _run_cell(source, namespace)
        else:
            exec(compile(source, "<string>", "exec"), namespace)
    except SystemExit as exc:
        code = _exit_code_of(exc)
        if cell and code:  # a notebook shows it as the cell's error
            record_error(exc, _program_frames(exc.__traceback__))
        return code
    except BaseException as exc:
        # The traceback starts at the program, as with `python -c`.
        tb = _program_frames(exc.__traceback__)
        traceback.print_exception(type(exc), exc, tb)
        record_error(exc, tb)
        return 1
    return 0


def _program_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback less this file's frames (the runner's, a cell's, display's): the model
    sees only its program's own lines, whatever ran them."""
    kept = []
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != _program_frames.__code__.co_filename:
            kept.append(tb)
        tb = tb.tb_next
    for frame, following in zip(kept, [*kept[1:], None], strict=True):
        frame.tb_next = following
    return kept[0] if kept else None


def _forget_scratch_listings() -> None:
    """Drop the import system's cached listings of the writable directories, where the program's
    input files (or an earlier cell's) may have appeared. The rest of sys.path is read-only:
    importlib.invalidate_caches() would cost 0.8 ms of a fresh child's copy-on-write faults."""
    for path, finder in list(sys.path_importer_cache.items()):
        if path in SCRATCH_DIRS or path.startswith(_SCRATCH_PREFIXES):
            invalidate = getattr(finder, "invalidate_caches", None)
            if invalidate:
                invalidate()


def _run_cell(source: str, namespace: dict[str, Any]) -> None:
    """Notebook semantics: run the statements, print the repr of a last expression not None."""
    import ast

    tree = ast.parse(source, "<cell>", "exec")
    last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    if last is not None:
        tree.body.pop()
    exec(compile(tree, "<cell>", "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
        if value is not None:
            display_value(value)


def _flush_and_finish(status: int) -> int:
    import atexit
    import threading

    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # wait for non-daemon threads
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = status or 120  # the interpreter's status when flushing stdout fails
    return status


# --- the zygote: PID 1 ------------------------------------------------------------------------


def _kill_everyone_else() -> float:
    """SIGKILL every process of the namespace but this one, reap them all, return their CPU."""
    cpu = 0.0
    for _ in range(100):
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        cpu += _reap_all(block=True)
        if not any(p.isdigit() and p != "1" for p in os.listdir("/proc")):
            return cpu
    raise RuntimeError("processes survived kill(-1)")


def _reap_all(block: bool) -> float:
    """Reap children (orphans included); return the CPU seconds of those reaped."""
    cpu = 0.0
    while True:
        try:
            pid, _status, usage = os.wait4(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return cpu
        if pid == 0:
            return cpu
        cpu += usage.ru_utime + usage.ru_stime


_PROGRAM: dict[str, Any] = {"uid": None, "cgroup_fds": [], "scratch": []}
"""Who runs programs, set by main() from its arguments: the program's uid, descriptors of the
run cgroups' cgroup.procs, and the scratch mounts (directory, tmpfs options)."""
_MS_NOSUID_NODEV = 2 | 4
_MNT_DETACH = 2


def become_program() -> None:
    """In a process the zygote forked to run a program (a standby, a session's interpreter, a
    helper writing a session's input files): into the run's cgroups, then the program's uid.

    The move comes first: the descriptors are the worker's (the kernel checks its credentials),
    and they are closed at once, so that no program can write another pid there (PID 1's).
    Leaving uid 0 clears every capability; the zygote keeps its own.
    """
    fds, _PROGRAM["cgroup_fds"] = _PROGRAM["cgroup_fds"], []
    for fd in fds:
        os.write(fd, b"0")  # 0: the writer itself
        os.close(fd)
    uid = _PROGRAM["uid"]
    if uid is not None:
        if os.getgroups():
            os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


def fresh_scratch() -> None:
    """A new, empty tmpfs on each writable directory, the last run's detached with all it held
    (files, their extended attributes, ACLs and times, the directories' own): nothing a run
    wrote there reaches the next. Every process of the last run is dead by now."""
    libc = _libc()
    for target, options in _PROGRAM["scratch"]:
        path = target.encode()
        if (
            libc.umount2(path, _MNT_DETACH) != 0
            or libc.mount(b"tmpfs", path, b"tmpfs", _MS_NOSUID_NODEV, options.encode()) != 0
        ):
            errno = ctypes.get_errno()
            raise OSError(errno, f"cannot mount a fresh {target}: {os.strerror(errno)}")


def _open_beneath(path: str, flags: int, create_dirs: bool = False) -> int:
    """Open a path under a writable directory (the working directory for a relative one)
    without following any symlink."""
    root, rel_path = protocol.root_of(protocol.checked_path(path))
    parts = rel_path.split("/")
    dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            if create_dirs:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=dir_fd)
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            os.close(dir_fd)
            dir_fd = next_fd
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


class InputFileError(OSError):
    """An input file could not be written where the request put it."""


def _write_files(files: dict[str, bytes]) -> None:
    """Write the input files; never follows a link, never blocks on a FIFO, never writes into
    anything but a regular file (a session's earlier cell may have left anything there)."""
    for rel_path, data in files.items():
        # O_NONBLOCK: opening a FIFO for writing fails (ENXIO) instead of waiting for a reader.
        fd = _open_beneath(rel_path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, create_dirs=True)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InputFileError(f"{rel_path}: exists and is not a regular file")
            os.set_blocking(fd, True)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def _fetch_files(paths: tuple[str, ...], budget: protocol.FetchBudget) -> protocol.Fetched:
    """The requested files that exist, as long as the run's budget (count, bytes) lasts."""
    found: dict[str, bytes] = {}
    missing: list[str] = []
    errors: dict[str, str] = {}
    bytes_left = budget.max_bytes
    for rel_path in paths:
        if rel_path in found or rel_path in errors or rel_path in missing:
            continue
        if len(found) >= budget.max_files:
            errors[rel_path] = f"{protocol.OVER_BUDGET} ({budget.max_files} files)"
            continue
        try:
            fd = _open_beneath(rel_path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            missing.append(rel_path)
            continue
        except OSError as exc:
            # ELOOP (a symlink), ENOTDIR, ENXIO (a socket): never followed, never blocks.
            errors[rel_path] = f"{type(exc).__name__}: {exc.strerror}"
            continue
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                errors[rel_path] = "not a regular file"
                continue
            if info.st_size > bytes_left:
                errors[rel_path] = (
                    f"{protocol.OVER_BUDGET} ({info.st_size} bytes, {bytes_left} of "
                    f"{budget.max_bytes} left)"
                )
                continue
            data = f.read(bytes_left + 1)
        if len(data) > bytes_left:  # grew since fstat (a session's background process)
            errors[rel_path] = f"{protocol.OVER_BUDGET} ({budget.max_bytes} bytes)"
            continue
        bytes_left -= len(data)
        found[rel_path] = data
    return protocol.Fetched(found, tuple(missing), errors)


@dataclass(frozen=True, slots=True)
class _Taken:
    """standby -> zygote, on a private pipe before the program starts: what the zygote needs
    of the request it took to supervise the run (not the request itself: its input files
    would be encoded, decoded and validated a second time), or why it could not be set up."""

    started: float
    cpu_before_s: float
    """The standby's CPU at the request (its rusage covers its preparation too)."""
    timeout_s: float
    fetch: tuple[str, ...]
    fetch_budget: protocol.FetchBudget
    setup_error: str | None
    cpu_limit_s: float = 0.0
    """The RLIMIT_CPU the program gets, which the kernel compares with the process's whole CPU
    time (its preparation as a standby included)."""

    @classmethod
    def of(cls, started: float, cpu_before_s: float, request: protocol.RunRequest) -> _Taken:
        """What the zygote needs of a valid request."""
        return cls(
            started,
            cpu_before_s,
            request.limits.timeout_s,
            request.fetch,
            request.fetch_budget,
            None,
            request.limits.cpu_time_s,
        )

    def to_line(self) -> bytes:
        wire = {
            "op": "run",
            "started": self.started,
            "cpu_before_s": self.cpu_before_s,
            "timeout_s": self.timeout_s,
            "fetch": list(self.fetch),
            "fetch_budget": self.fetch_budget.to_wire(),
            "setup_error": self.setup_error,
            "cpu_limit_s": self.cpu_limit_s,
        }
        return (json.dumps(wire, ensure_ascii=False) + "\n").encode()

    @classmethod
    def from_wire(cls, obj: dict[str, Any]) -> _Taken:
        timeout_s = float(obj["timeout_s"])
        if not math.isfinite(timeout_s):
            raise ValueError("timeout_s: not a finite number")
        fetch = obj["fetch"]
        if not isinstance(fetch, list):
            raise ValueError("fetch: expected a list")
        return cls(
            started=float(obj["started"]),
            cpu_before_s=float(obj["cpu_before_s"]),
            timeout_s=timeout_s,
            fetch=tuple(protocol.checked_path(path) for path in fetch),
            fetch_budget=protocol.FetchBudget.from_wire(obj["fetch_budget"]),
            setup_error=None if obj.get("setup_error") is None else str(obj["setup_error"]),
            cpu_limit_s=float(obj.get("cpu_limit_s", 0.0)),
        )


def standby(sock: socket.socket, forward_fd: int, go_fd: int, warm_up: bool) -> None:
    """A pre-forked child: take the next request, tell the zygote, become the program.

    Forking ahead of the request takes the fork (copying the page tables of the preloaded heap)
    off the execution's critical path, and so does prepare_child. A warming standby also runs
    `exercise` and reports `warm` (see _choose_standby). The socket is read only once the
    zygote says go on `go_fd`. Never returns.
    """
    try:
        become_program()
        # Dumpable again (a change of uid, like the zygote, made it not) so that its /proc
        # files are its own to write.
        _libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        _be_the_oom_killers_pick()
        namespace = prepare_child()
        if warm_up:
            exercise()
            _send_line(forward_fd, {"op": "warm"})
        go = os.read(go_fd, 1)
        os.close(go_fd)
        if not go:  # the zygote is gone
            os._exit(0)
        # Only now: the scratch directories are mounted afresh between the fork and the go.
        os.chdir(WORK_DIR)
        try:
            message, fds = recv_frame(sock, max_fds=4)
        except (EOFError, OSError):
            message, fds = {"op": "exit"}, []
        started = time.monotonic()
        cpu_before = _cpu_of_self_and_children()
        sock.close()
        if message.get("op") in ("exit", ABORT) and not fds:
            _send_line(forward_fd, {"op": message["op"]})
            os._exit(0)
        request: protocol.RunRequest | None = None
        setup_error = None
        try:
            request = protocol.RunRequest.from_wire(message)
            if len(fds) != 4:
                raise protocol.ProtocolError(f"{len(fds)} descriptors, expected 4")
        except protocol.ProtocolError as exc:
            request, setup_error = None, f"malformed request: {exc}"
        if request is not None:
            try:
                _write_files(request.files)
            except (OSError, ValueError) as exc:
                setup_error = f"could not write input files: {exc}"
        if request is None or setup_error is not None:
            taken = _Taken(started, cpu_before, 0.0, (), protocol.FetchBudget(), setup_error)
        else:
            taken = _Taken.of(started, cpu_before, request)
        data = taken.to_line()
        while data:
            data = data[os.write(forward_fd, data) :]
        if setup_error or request is None:
            os._exit(0)
        code_fd, stdin_fd, stdout_fd, stderr_fd = fds
        os.dup2(stdin_fd, 0)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        # The pipe to the zygote too: the program holds no descriptor of the control path.
        _close_all_but(code_fd)
        if request.seed is not None:
            seed_random(request.seed)
    except BaseException:
        traceback.print_exc()  # to the jail's log: this is our failure, not the program's
        os._exit(70)
    run_child(code_fd, request.limits, namespace)


def _be_the_oom_killers_pick() -> None:
    """The memory limit's OOM killer must pick the program, never the zygote."""
    fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    try:
        os.write(fd, b"1000")
    finally:
        os.close(fd)


def _close_all_but(*keep: int) -> None:
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _send_line(fd: int, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


class _LineReader:
    """JSON lines from a standby's pipe (`warm`, then the request it took), bounded in length.

    Only the standby writes there, before the program starts; the bound and the validation of
    each line guard against our own bugs all the same.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def read_line(self) -> dict[str, Any] | None:
        """The next line's object; None at end of file or for a line that is not one."""
        while (end := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > MAX_TAKEN_LINE_BYTES:
                return None
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                return None
            self._buffer += chunk
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 1]
        try:
            value = json.loads(line)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def close(self) -> None:
        os.close(self.fd)


def _wait_child(
    pid: int, deadline: float, sock: socket.socket
) -> tuple[int | None, int | None, float, bool]:
    """Wait for the program's process to end, until the deadline or an abort from the worker.

    Returns (exit code, signal, its CPU seconds, timed out), all from the kernel's wait status
    and rusage.
    """
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            remaining = deadline - time.monotonic()
            ready = select.select([pidfd, sock.fileno()], [], [], max(remaining, 0))[0]
            if pidfd in ready:
                _, status, usage = os.wait4(pid, 0)
                cpu = usage.ru_utime + usage.ru_stime
                if os.WIFSIGNALED(status):
                    return None, os.WTERMSIG(status), cpu, False
                return os.WEXITSTATUS(status), None, cpu, False
            # Out of time, or the worker wrote during a run to abort it (or it went away).
            if sock.fileno() in ready:
                _consume_abort(sock)
            return None, signal.SIGKILL, 0.0, True
    finally:
        os.close(pidfd)


def _consume_abort(sock: socket.socket) -> None:
    """Read the worker's abort frame, so that the next request is read from its start."""
    with contextlib.suppress(EOFError, OSError, ValueError, protocol.ProtocolError):
        recv_frame(sock)


def supervise(pid: int, taken: _Taken, sock: socket.socket) -> protocol.RunReply:
    """Wait for the program to end or time out, kill its whole tree, describe the outcome."""
    exit_code, signum, cpu, timed_out = _wait_child(pid, taken.started + taken.timeout_s, sock)
    wall = time.monotonic() - taken.started
    limit_reached = cpu_limit_reached(cpu, taken.cpu_limit_s)
    # The child's rusage covers its life as a standby too: less what it had used by then.
    if timed_out or signum is not None:
        # The slow paths count the whole tree (on a timeout, the child is reaped there).
        cpu = max(cpu + _kill_everyone_else() - taken.cpu_before_s, 0.0)
    else:
        cpu = max(cpu - taken.cpu_before_s, 0.0)
        # SIGKILL is pending for every other process once kill(-1) returns: none of them runs
        # another instruction of the program, so the answer need not wait for their teardown.
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
    return protocol.RunReply(
        exit_code=exit_code,
        signal=signum,
        timed_out=timed_out,
        cpu_limit_reached=limit_reached,
        wall_time_s=wall,
        cpu_time_s=cpu,
        fetched=_fetch_files(taken.fetch, taken.fetch_budget),
        outputs=take_outputs(),
    )


@dataclass(slots=True)
class _Standby:
    """The zygote's handle on a pre-forked standby."""

    pid: int
    lines: _LineReader
    go_fd: int
    warmed: bool

    def release(self) -> None:
        """Let it take the next request."""
        os.write(self.go_fd, b"g")
        os.close(self.go_fd)

    def discard(self) -> None:
        """Kill it and wait for its end (it never ran a program)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.lines.close()
        os.close(self.go_fd)


def _fork_standby(sock: socket.socket, warm_up: bool = False) -> _Standby:
    _reseed_random()  # for this child alone
    forward_r, forward_w = os.pipe()
    go_r, go_w = os.pipe()
    try:
        pid = fork_lean()
    except OSError:
        for fd in (forward_r, forward_w, go_r, go_w):
            os.close(fd)
        raise
    if pid == 0:
        os.close(forward_r)
        os.close(go_w)
        standby(sock, forward_w, go_r, warm_up)
    os.close(forward_w)
    os.close(go_r)
    return _Standby(pid, _LineReader(forward_r), go_w, warmed=warm_up)


def _choose_standby(sock: socket.socket, clean: _Standby, idle_warm_up: str) -> _Standby:
    """Wait for the next request; the standby that is to take it.

    A forked child writes to many pages of the preloaded heap (reference counts, caches), and
    each first write costs a copy-on-write fault: about half the time of a sympy call. When
    the slot stays idle, a second standby runs `exercise` to take those faults before the
    request comes. The clean standby stays ready meanwhile: a request arriving before the
    warm-up is done goes to it and the warming one is killed, so a warm-up never delays a
    request by more than that kill, and is never interrupted half-way (which could leave a
    library's cache half-written in the process that then runs the program). idle_warm_up:
    "auto" (only while the host's CPUs are not all busy), "always" or "never".
    """
    if idle_warm_up == "never" or select.select([sock], [], [], WARM_UP_AFTER_IDLE_S)[0]:
        return clean
    if idle_warm_up == "auto" and host_busy():
        return clean
    try:
        warming = _fork_standby(sock, warm_up=True)
    except OSError:  # the pids limit leaves no room for a second standby
        return clean
    ready = select.select([sock.fileno(), warming.lines.fd], [], [])[0]
    if warming.lines.fd in ready and warming.lines.read_line() == {"op": "warm"}:
        clean.discard()
        return warming
    warming.discard()  # a request came first (or the warm-up failed)
    return clean


def _reap_all_but(keep: int) -> None:
    """Reap every process of the namespace but this one and `keep`; each has SIGKILL pending.

    Orphans become this process's children as their parents die, so the loop ends once their
    teardowns are done.
    """
    spared = {"1", str(keep)}
    deadline = time.monotonic() + REAP_DEADLINE_S
    while any(p.isdigit() and p not in spared for p in os.listdir("/proc")):
        if time.monotonic() > deadline:
            raise RuntimeError("processes survived SIGKILL")
        reaped = 0
        with contextlib.suppress(ChildProcessError):
            while os.wait4(-1, os.WNOHANG)[0] > 0:
                reaped += 1
        if not reaped:
            time.sleep(0.0002)


def _next_standby(sock: socket.socket) -> _Standby:
    """After an answer: end the last run's processes, wipe its files, fork a new standby.

    The new standby is forked first, so that its fork and preparation overlap the kernel's
    teardown of the last program's address space. kill(-1) before the fork leaves SIGKILL
    pending on every other process, and a process with SIGKILL pending neither returns to its
    program nor forks: nothing of the last run can reach the new standby.
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)
    try:
        ahead: _Standby | None = _fork_standby(sock)
    except OSError:  # EAGAIN: the last run's processes still fill the cgroup's pids limit
        ahead = None
    if ahead is None:
        _kill_everyone_else()
    else:
        _reap_all_but(ahead.pid)
    fresh_scratch()
    return ahead or _fork_standby(sock)


def _take(current: _Standby) -> _Taken | str | None:
    """What the released standby took: a run, ABORT (a stray abort frame), or None (exit, the
    worker gone, or a standby that died or said something unexpected)."""
    line = current.lines.read_line()
    if line is not None and line.get("op") == ABORT:
        return ABORT
    if line is None or line.get("op") != "run":
        return None
    try:
        return _Taken.from_wire(line)
    except (KeyError, TypeError, ValueError):
        return None


def serve(sock: socket.socket, once: bool, idle_warm_up: str) -> None:
    """Answer run requests through pre-forked children until told to exit (cold mode: one)."""
    current = _fork_standby(sock)
    while True:
        current = _choose_standby(sock, current, idle_warm_up)
        current.release()
        taken = _take(current)
        current.lines.close()
        if isinstance(taken, str):
            # An abort that crossed the end of its run on the wire: that run is answered.
            current = _next_standby(sock)
            continue
        if taken is None:
            # Leave, and let the worker's side see the jail end.
            _kill_everyone_else()
            return
        if taken.setup_error is not None:
            reply = protocol.RunReply(setup_error=taken.setup_error[:_MAX_SETUP_ERROR_CHARS])
        else:
            reply = supervise(current.pid, taken, sock)
        reply = dataclasses.replace(reply, warmed=current.warmed)
        sock.sendall(protocol.reply_frame(reply)[1])
        if once:
            _kill_everyone_else()
            return
        current = _next_standby(sock)


# --- sessions: one persistent interpreter per jail ----------------------------------------------


def session_interpreter(channel: socket.socket) -> None:
    """The session's interpreter: runs cells sent by the zygote in one namespace. Never returns.

    It holds only its private channel to the zygote, never the worker's control socket; the
    cells run in this process, so they can write to the channel, and the zygote believes
    nothing from it but a cell's status (see serve_session).
    """
    try:
        become_program()
        _close_all_but(channel.fileno())
        _libc().prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        _be_the_oom_killers_pick()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(WORK_DIR)
        cwd = WORK_DIR
        _reseed_random()
        namespace = _fresh_main()
        devnull = os.open("/dev/null", os.O_RDWR)
        while True:
            try:
                message, fds = recv_frame(channel, max_fds=FORK_BATCH)
                if message.get("op") == FORK:
                    channel = _fork_interpreter(channel, fds)
                    continue
                limits = protocol.RunLimits.from_wire(message.get("limits"))
            except (EOFError, OSError):
                os._exit(0)
            code_fd, stdin_fd, stdout_fd, stderr_fd = fds
            with os.fdopen(code_fd, "rb") as f:
                source = f.read().decode("utf-8", errors="surrogateescape")
            for target, fd in ((0, stdin_fd), (1, stdout_fd), (2, stderr_fd)):
                os.dup2(fd, target)
                os.close(fd)
            if message.get("moved"):  # a sibling ran on mounts since: ours are new ones
                _enter_again(cwd)
            _install_std_streams(_std_streams())
            _cell_limits(limits)
            seed = message.get("seed")
            seed_random(seed if isinstance(seed, int) else None)
            status = _run_source(source, namespace, cell=True)
            with contextlib.suppress(BaseException):
                cwd = os.getcwd()
            with contextlib.suppress(BaseException):
                leave_outputs()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(BaseException):
                    stream.flush()
            # Let go of this cell's pipes, so the worker sees their end.
            for target in (0, 1, 2):
                os.dup2(devnull, target)
            send_frame(channel, protocol.CellDone(status & 0xFF).to_wire())
    except BaseException:
        traceback.print_exc()
        os._exit(70)


def _enter_again(cwd: str) -> None:
    """Enter the working directory of the last cell by its path (the working directory if it
    is gone): the process's was on a scratch mount detached since (_Family.switch_to)."""
    try:
        os.chdir(cwd)
    except OSError:
        with contextlib.suppress(OSError):
            os.chdir(WORK_DIR)


FORK = "fork"
"""The op of the frame the zygote sends an interpreter between cells to fork it; the one
descriptor with it is the fork's channel."""
FORK_BATCH = 64
"""Copies asked for in one fork frame (one descriptor each, one middle process)."""
HELLO = b"h"
"""A fork's first byte on its channel: the kernel attaches its pid (SCM_CREDENTIALS)."""


def _fork_interpreter(channel: socket.socket, fds: list[int]) -> socket.socket:
    """In an interpreter told to fork: one copy of this process per descriptor passed, each the
    zygote's child (a middle process forks them all and exits, so they are reparented to PID 1)
    serving its descriptor as its channel; the channel this process goes on with (a copy: its
    new one). A copy that cannot be made leaves its descriptor closed: the zygote sees EOF."""
    # Non-dumpable from here on, this process and its copies: their memory and /proc files are
    # then no sibling's to read or write (the same uid would otherwise be enough).
    _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    try:
        middle = os.fork()
    except OSError:  # the pids limit: no copy
        middle = -1
    if middle == 0:
        for mine in fds:
            try:
                copy_pid = os.fork()
            except OSError:
                os._exit(1)
            if copy_pid == 0:
                for other in fds:
                    if other != mine:
                        os.close(other)
                channel.close()
                return _become_copy(socket.socket(fileno=mine))
        os._exit(0)
    for fd in fds:
        os.close(fd)
    if middle > 0:
        os.waitpid(middle, 0)
    return channel


def _become_copy(copy: socket.socket) -> socket.socket:
    deadline = time.monotonic() + FORK_HELLO_DEADLINE_S / 2
    while os.getppid() != 1 and time.monotonic() < deadline:
        time.sleep(0.0002)
    _reseed_random()  # each fork draws its own numbers (a seeded cell seeds them again)
    copy.sendall(HELLO)
    return copy


def _cell_limits(limits: protocol.RunLimits) -> None:
    # RLIMIT_CPU counts the interpreter's whole life and a hard limit cannot be raised again:
    # each cell moves the soft limit to what is used so far plus the cell's budget.
    used = int(_cpu_of_self_and_children()) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = used + limits.cpu_time_s
    resource.setrlimit(
        resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard)
    )


def _cpu_of_self_and_children() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_CPUCLOCK_SCHED = 2
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_of_process(pid: int) -> float:
    """CPU seconds of another process and of its waited-for children, as the kernel counts:
    its CPU clock (nanoseconds, every thread) and the cutime/cstime of /proc/<pid>/stat."""
    try:
        own = time.clock_gettime(((~pid) << 3) | _CPUCLOCK_SCHED)
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read(4096).rpartition(b")")[2].split()
        children = (int(fields[13]) + int(fields[14])) / _CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return 0.0
    return own + children


def _kill_all_but(*keep: int) -> float:
    """SIGKILL every process of the namespace but this one and `keep` (the interpreters: this
    kills a cell's background processes); reap the orphans; return their CPU seconds."""
    spared = {"1", *map(str, keep)}
    cpu = 0.0
    deadline = time.monotonic() + REAP_DEADLINE_S
    while True:
        others = [int(p) for p in os.listdir("/proc") if p.isdigit() and p not in spared]
        alive = [p for p in others if not _is_zombie(p)]
        if not alive:
            return cpu + _reap_all(block=False)
        if time.monotonic() > deadline:
            raise RuntimeError("processes survived SIGKILL")
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cpu += _reap_all(block=False)
        time.sleep(0.0002)


def _is_zombie(pid: int) -> bool:
    """Dead but not reaped (the interpreter's own children stay so until it waits for them)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read(4096).rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return True  # gone
    return state in (b"Z", b"X")


def _drain(channel: socket.socket) -> None:
    """Discard what the interpreter wrote between cells (a cell's thread may write any time)."""
    with contextlib.suppress(BlockingIOError, InterruptedError):
        while channel.recv(1 << 16, socket.MSG_DONTWAIT):
            pass


@dataclass(slots=True)
class _Member:
    """One interpreter of a session jail: the session's, or a fork of it."""

    pid: int
    pidfd: int
    channel: socket.socket
    files: bytes | None = None
    """Its scratch directories (a tar) while another member's are in place."""
    moved: bool = False
    """The scratch directories were mounted afresh since its last cell: it must enter its
    working directory again (by path) before the next."""

    def dead(self) -> bool:
        return bool(select.select([self.pidfd], [], [], 0)[0])

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        os.close(self.pidfd)
        self.channel.close()


FORK_HELLO_DEADLINE_S = 10.0
"""How long the zygote waits for each copy's hello (a loaded host delays the middle's exit)."""
MAX_MEMBERS = 4096
_UCRED = struct.Struct("3i")


class _Family:
    """The interpreters of one session jail: one, until the session is forked.

    Forks are copies of a member's process (copy-on-write); they share the jail, its memory and
    process limits. Only one member runs at a time: the others are stopped (SIGSTOP) and their
    scratch files kept aside, so a member never sees a sibling's later state or files; a member
    whose turn comes gets its own files back (docs/service.md, "Forked sessions").
    """

    def __init__(self, first: _Member) -> None:
        self.members: dict[int, _Member] = {0: first}
        self.current: int | None = 0
        """The member whose files are in the scratch directories and that is not stopped."""
        self._next = 1

    def pids(self) -> list[int]:
        return [member.pid for member in self.members.values()]

    def switch_to(self, key: int) -> None:
        """Make `key` the running member with its files in place (nothing when it is)."""
        if key == self.current:
            return
        for other, member in self.members.items():
            if other != key:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member.pid, signal.SIGSTOP)
        _kill_all_but(*self.pids())
        self._wait_stopped(key)
        leaving = self.members.get(self.current) if self.current is not None else None
        if leaving is not None and self.current is not None:
            try:
                leaving.files = _snapshot_scratch()
            except (OSError, ValueError, RecursionError):
                # A tree it could not be read back from: that member's live state is given
                # up, and its session rebuilt from its records at its next cell.
                self.drop(self.current)
        # Fresh mounts, as between warm runs: nothing of the last member's (files, their
        # attributes, the directories' own) reaches the next but what its own tar holds.
        self.current = None
        fresh_scratch()
        arriving = self.members[key]
        arriving.moved = True  # its working directory was on a mount now detached
        if arriving.files:
            failure = _as_program(_restore_scratch, arriving.files)
            if failure is not None:
                raise OSError(f"its files could not be put back: {failure}")
        arriving.files = None
        self.current = key
        with contextlib.suppress(ProcessLookupError):
            os.kill(arriving.pid, signal.SIGCONT)

    def _wait_stopped(self, running: int) -> None:
        deadline = time.monotonic() + REAP_DEADLINE_S
        for key, member in self.members.items():
            while key != running and not _is_stopped(member.pid):
                if time.monotonic() > deadline:
                    raise RuntimeError("an interpreter did not stop")
                time.sleep(0.0002)

    def drop(self, key: int) -> None:
        """End one member (its session ended, or its interpreter died)."""
        member = self.members.pop(key, None)
        if member is not None:
            member.close()
        if key == self.current:
            self.current = None  # its files stay until the next member's turn wipes them

    def fork(self, key: int, n: int) -> list[int]:
        """Fork member `key` n times; the new members' keys (stopped, with its files). Raises
        RuntimeError when a copy does not come (the caller drops what was made)."""
        self.switch_to(key)
        parent = self.members[key]
        _drain(parent.channel)
        made: list[int] = []
        ours: list[socket.socket] = []
        try:
            for first in range(0, n, FORK_BATCH):
                theirs = []
                for _ in range(min(FORK_BATCH, n - first)):
                    mine, their = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                    mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                    ours.append(mine)
                    theirs.append(their)
                try:
                    send_frame(parent.channel, {"op": FORK}, [t.fileno() for t in theirs])
                finally:
                    for their in theirs:
                        their.close()
            known = set(self.pids())
            for channel, pid in _await_forks(ours, known):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                self.members[self._next] = _Member(pid, os.pidfd_open(pid), channel)
                ours.remove(channel)
                made.append(self._next)
                self._next += 1
        except (RuntimeError, OSError):
            for channel in ours:
                channel.close()
            for new in made:
                self.drop(new)
            raise
        files = _snapshot_scratch()
        for new in made:
            self.members[new].files = files  # one copy, shared until each one's turn
        return made


def _await_forks(channels: list[socket.socket], known: set[int]) -> list[tuple[socket.socket, int]]:
    """Each channel's copy and its pid, as the kernel gives it with the copy's hello
    (SCM_CREDENTIALS), never the copy's word: a new child of the zygote, each a different one.
    RuntimeError when one does not come within the deadline or is not such a child."""
    waiting = {channel.fileno(): channel for channel in channels}
    found: list[tuple[socket.socket, int]] = []
    deadline = time.monotonic() + FORK_HELLO_DEADLINE_S
    while waiting:
        remaining = deadline - time.monotonic()
        ready = select.select(list(waiting), [], [], max(remaining, 0))[0] if remaining > 0 else []
        if not ready:
            raise RuntimeError("the interpreter did not fork")
        for fd in ready:
            channel = waiting.pop(fd)
            data, ancillary, _flags, _addr = channel.recvmsg(1, socket.CMSG_SPACE(_UCRED.size))
            pid = 0
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _UCRED.unpack(payload[: _UCRED.size])[0]
            if data != HELLO or pid <= 1 or pid in known or _parent_of(pid) != 1:
                raise RuntimeError("a fork's hello is not from a new child of the zygote")
            known.add(pid)
            found.append((channel, pid))
    return found


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read(4096).rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _is_stopped(pid: int) -> bool:
    """Stopped, or gone (nothing left to stop)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read(4096).rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in (b"T", b"t", b"Z", b"X")


def _snapshot_scratch() -> bytes:
    """The scratch directories' contents as a tar (no link followed)."""
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for top in SCRATCH_DIRS:
            for name in sorted(os.listdir(top)):
                tar.add(os.path.join(top, name), recursive=True)
    return buffer.getvalue()


def _restore_scratch(files: bytes) -> None:
    """Put a snapshot back into the fresh scratch directories, as the program (_as_program):
    the files are its own again, and the zygote writes nothing there. The tar is the zygote's
    own, made from a tree where no entry lies under a link while every process was stopped."""
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(files), mode="r") as tar:
        tar.extractall("/", filter="fully_trusted")


def _start_interpreter(sock: socket.socket) -> _Member:
    channel, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        sock.close()
        channel.close()
        session_interpreter(theirs)
    theirs.close()
    return _Member(pid, os.pidfd_open(pid), channel)


def _serve_fork(sock: socket.socket, family: _Family, message: dict[str, Any]) -> None:
    """Answer a fork request: the new members' keys, or why there are none."""
    try:
        request = protocol.ForkMembers.from_wire(message)
        if request.member not in family.members or family.members[request.member].dead():
            raise RuntimeError(protocol.INTERPRETER_GONE)
        if len(family.members) + request.n > MAX_MEMBERS:
            raise RuntimeError(f"more than {MAX_MEMBERS} interpreters in one jail")
        reply = protocol.Forked(members=tuple(family.fork(request.member, request.n)))
    except (protocol.ProtocolError, RuntimeError, OSError) as exc:
        reply = protocol.Forked(members=(), error=str(exc))
    send_frame(sock, reply.to_wire())


def serve_session(sock: socket.socket) -> None:
    """Run cells in persistent interpreters until told to exit, or until a cell kills the last.

    Notebook semantics: an interpreter (its namespace, its threads) lives from cell to cell;
    processes a cell started are killed when the cell ends. A cell that times out, whose
    interpreter dies, or that breaks the channel's protocol ends its interpreter (and the jail
    with the last one) after its answer: the worker then rebuilds that session elsewhere by
    replaying its recorded cells. Forks (`fork` requests) add interpreters: see _Family.
    """
    family = _Family(_start_interpreter(sock))
    while True:
        try:
            message, fds = recv_frame(sock, max_fds=4)
        except EOFError:
            break
        op = message.get("op")
        if op in ("exit", ABORT, FORK, "drop"):
            for fd in fds:
                os.close(fd)
            if op == "exit":
                break
            if op == FORK:
                _serve_fork(sock, family, message)
            elif op == "drop":
                key = message.get("member")
                if isinstance(key, int) and key in family.members and len(family.members) > 1:
                    family.drop(key)
            continue  # an abort crossed the end of its cell on the wire: that cell is answered
        try:
            request = protocol.RunRequest.from_wire(message)
            if len(fds) != 4:
                raise protocol.ProtocolError(f"{len(fds)} descriptors, expected 4")
        except protocol.ProtocolError as exc:
            for fd in fds:
                os.close(fd)
            why = f"malformed request: {exc}"[:_MAX_SETUP_ERROR_CHARS]
            send_frame(sock, protocol.RunReply(setup_error=why).to_wire())
            continue
        member = family.members.get(request.member)
        if member is None or member.dead():
            for fd in fds:
                os.close(fd)
            family.drop(request.member)
            gone = protocol.RunReply(setup_error=protocol.INTERPRETER_GONE)
            send_frame(sock, gone.to_wire())
            if not family.members:
                break
            continue
        try:
            family.switch_to(request.member)
        except (OSError, RuntimeError, ValueError) as exc:
            # Its files could not be put back, or processes outlived SIGKILL: this member's
            # session (all of them, for the latter) is rebuilt from its records.
            for fd in fds:
                os.close(fd)
            family.drop(request.member)
            send_frame(sock, protocol.RunReply(setup_error=protocol.INTERPRETER_GONE).to_wire())
            if isinstance(exc, RuntimeError) or not family.members:
                break
            continue
        failure = _as_program(_write_files, request.files) if request.files else None
        if failure is not None:
            for fd in fds:
                os.close(fd)
            reply = protocol.RunReply(
                setup_error=f"could not write input files: {failure}"[:_MAX_SETUP_ERROR_CHARS],
                session_alive=True,
            )
            send_frame(sock, reply.to_wire())
            continue
        pid, channel = member.pid, member.channel
        _drain(channel)
        started = time.monotonic()
        cpu_before = _cpu_of_process(pid)
        cell = {
            "op": "cell",
            "limits": request.limits.to_wire(),
            "seed": request.seed,
            "moved": member.moved,
        }
        member.moved = False
        send_frame(channel, cell, fds)
        for fd in fds:
            os.close(fd)
        reply = _supervise_cell(
            pid, member.pidfd, channel, sock, started + request.limits.timeout_s, cpu_before
        )
        # The interpreter's soft limit is its CPU so far (rounded up) plus the cell's budget.
        reached = cpu_limit_reached(reply.cpu_time_s, request.limits.cpu_time_s)
        reply = dataclasses.replace(reply, cpu_limit_reached=reached)
        if reply.session_alive:
            try:
                extra = _kill_all_but(*family.pids())
                reply = dataclasses.replace(reply, cpu_time_s=reply.cpu_time_s + extra)
            except RuntimeError:
                reply = dataclasses.replace(reply, session_alive=False)
        ending = not reply.session_alive and len(family.members) == 1
        if not reply.session_alive and not ending:
            family.drop(request.member)  # the others are stopped: what runs is this member's
            try:
                reply = dataclasses.replace(
                    reply, cpu_time_s=reply.cpu_time_s + _kill_all_but(*family.pids())
                )
            except RuntimeError:
                ending = True
        if ending:
            cpu = reply.cpu_time_s + _kill_everyone_else()
            reply = dataclasses.replace(reply, cpu_time_s=cpu)
        reply = dataclasses.replace(
            reply,
            wall_time_s=time.monotonic() - started,
            fetched=_fetch_files(request.fetch, request.fetch_budget),
            outputs=take_outputs(),
        )
        sock.sendall(protocol.reply_frame(reply)[1])
        if ending:
            return
    _kill_everyone_else()


def _as_program[T](work: Callable[[T], None], files: T) -> str | None:
    """Run `work(files)` in a child that is the program's uid (the files it writes are the
    program's to change, and the zygote writes nothing into directories the program owns);
    None, or what went wrong."""
    read_end, write_end = os.pipe()
    pid = fork_lean()
    if pid == 0:
        os.close(read_end)
        try:
            become_program()
            work(files)
            os._exit(0)
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                os.write(write_end, str(exc).encode(errors="replace")[:4096])
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read(4097)
    _, status = os.waitpid(pid, 0)
    if status == 0:
        return None
    return message.decode(errors="replace") or f"the writer ended with status {status}"


def _supervise_cell(
    pid: int,
    pidfd: int,
    channel: socket.socket,
    sock: socket.socket,
    deadline: float,
    cpu_before: float,
) -> protocol.RunReply:
    """Wait for the cell's report, the interpreter's death, the deadline or an abort.

    The report is read without blocking, bounded and validated (the cell can write anything
    to the channel, or half a frame and stop): only a whole, valid CellDone ends the cell
    normally; anything else ends the session with a clear error.
    """
    frames = protocol.FrameBuffer(protocol.MAX_CELL_FRAME_BYTES)
    watched = [channel.fileno(), pidfd, sock.fileno()]
    while True:
        remaining = deadline - time.monotonic()
        ready = select.select(watched, [], [], remaining)[0] if remaining > 0 else []
        if channel.fileno() in ready:
            try:
                data = channel.recv(1 << 12, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                watched.remove(channel.fileno())  # the interpreter is going: its pidfd tells how
                continue
            try:
                frames.feed(data)
                message = frames.pop()
                done = None if message is None else protocol.CellDone.from_wire(message)
            except protocol.ProtocolError as exc:
                return _end_interpreter(pid, cpu_before, f"the cell broke its channel: {exc}")
            if done is None:
                continue
            cpu = max(_cpu_of_process(pid) - cpu_before, 0.0)
            return protocol.RunReply(exit_code=done.exit_code, cpu_time_s=cpu, session_alive=True)
        if pidfd in ready:
            _, status, usage = os.wait4(pid, 0)
            cpu = max(usage.ru_utime + usage.ru_stime - cpu_before, 0.0)
            if os.WIFSIGNALED(status):
                return protocol.RunReply(signal=os.WTERMSIG(status), cpu_time_s=cpu)
            return protocol.RunReply(exit_code=os.WEXITSTATUS(status), cpu_time_s=cpu)
        # Out of time, or the worker wrote during a cell (an abort, or it went away).
        if sock.fileno() in ready:
            _consume_abort(sock)
        cpu = max(_cpu_of_process(pid) - cpu_before, 0.0)
        return protocol.RunReply(signal=signal.SIGKILL, timed_out=True, cpu_time_s=cpu)


def _end_interpreter(pid: int, cpu_before: float, why: str) -> protocol.RunReply:
    cpu = max(_cpu_of_process(pid) - cpu_before, 0.0)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return protocol.RunReply(exit_code=1, cpu_time_s=cpu, program_error=why)


def prepare_heap(
    full: bool = False,
    contiguous: bool = True,
    immortal: bool = True,
    fill: bool = True,
    huge_code: bool = True,
) -> int:
    """Preload, and shape the heap for forking: arenas in one mapping (contiguous_arenas),
    objects immortal, frozen, the allocator's gaps taken, huge pages for the heap and the
    interpreter's code; the number of objects made immortal. The flags leave a step out, for
    scripts/fault_anatomy.py to measure it."""
    import gc

    changed = 0
    with contiguous_arenas() if contiguous else contextlib.nullcontext(False):
        preload(full)
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


def _take_program_arguments(argv: list[str]) -> None:
    if "--program-uid" in argv:
        _PROGRAM["uid"] = int(argv[argv.index("--program-uid") + 1])
    if "--run-cgroup-fds" in argv:
        fds = argv[argv.index("--run-cgroup-fds") + 1].split(",")
        _PROGRAM["cgroup_fds"] = [int(fd) for fd in fds]
        for fd in _PROGRAM["cgroup_fds"]:
            os.set_inheritable(fd, False)
    _PROGRAM["scratch"] = [
        tuple(value.split(":", 1))
        for flag, value in itertools.pairwise(argv)
        if flag == "--scratch"
    ]


def main() -> None:
    """Entry point inside the jail: `zygote.py --control-fd N [--preload] [--once|--session]`."""
    import gc

    if os.getpid() != 1:
        raise SystemExit("the zygote must be PID 1 of its namespace")
    resource.setrlimit(resource.RLIMIT_SIGPENDING, (MAX_PENDING_SIGNALS,) * 2)
    # Init ignores signals it has no handler for; drop Python's SIGINT handler to stay immune.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    control_fd = int(sys.argv[sys.argv.index("--control-fd") + 1])
    if "--loadavg-fd" in sys.argv:
        _LOADAVG_FD[0] = int(sys.argv[sys.argv.index("--loadavg-fd") + 1])
    _take_program_arguments(sys.argv)
    # Not in the working directory, which is mounted afresh for every run: a cwd there would
    # keep the first run's tmpfs, and its files, alive after it is detached.
    os.chdir("/")
    sock = socket.socket(fileno=control_fd)
    started = time.monotonic()
    immortal = 0
    cache = None
    if "--matplotlib-cache" in sys.argv:
        cache = sys.argv[sys.argv.index("--matplotlib-cache") + 1]
    install_matplotlib_hooks(cache)
    install_seed_hooks()
    make_children_std_streams()
    # Cold mode forks once, which the copy of the interpreter's code (4 ms) would not repay.
    once = "--once" in sys.argv
    if "--preload" in sys.argv:
        immortal = prepare_heap(full="--preload-full" in sys.argv, huge_code=not once)
    else:
        gc.collect()
        gc.freeze()
        if not once:
            interpreter_code_on_huge_pages()
    send_frame(sock, protocol.Ready(time.monotonic() - started, immortal).to_wire())
    # Fork nothing before the worker has moved this process into the slot's cgroups: a child
    # forked earlier would stay outside the memory and process limits.
    try:
        if protocol.Control.from_wire(recv_frame(sock)[0]).op != "serve":
            return
    except (EOFError, OSError, protocol.ProtocolError):
        return
    if "--session" in sys.argv:
        serve_session(sock)
    else:
        idle_warm_up = "never"
        if "--idle-warm-up" in sys.argv:
            idle_warm_up = sys.argv[sys.argv.index("--idle-warm-up") + 1]
        serve(sock, once=once, idle_warm_up=idle_warm_up)


if __name__ == "__main__":
    main()
