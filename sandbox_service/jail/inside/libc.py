"""The kernel calls the standard library lacks, through libc: prctl, mount, madvise, and a fork
that runs no at-fork handler.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Any

PR_SET_DUMPABLE = 4


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
    pid = fork_raw()
    if pid == 0 and threading is not None:
        threading.main_thread()._set_native_id()
    return pid


def fork_raw() -> int:
    """fork(2) through libc, with the GIL held (PyDLL): none of the interpreter's at-fork work,
    so no handler registered with os.register_at_fork runs, in the parent or in the child,
    whatever the process's threads. The child holds the calling thread alone; the interpreter's
    records of any other are left as they were (see fork_lean for what is then sound)."""
    if not _LIBC_FORK:
        libc_fork = ctypes.PyDLL(None, use_errno=True).fork
        libc_fork.restype, libc_fork.argtypes = ctypes.c_int, []
        _LIBC_FORK.append(libc_fork)
    pid: int = _LIBC_FORK[0]()
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return pid
