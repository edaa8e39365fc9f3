"""The jail's writable directories, and the files a request writes into them or fetches back,
opened beneath their root so that no link a program made leads out.
"""

from __future__ import annotations

import contextlib
import os
import stat

from . import protocol

WORK_DIR = "/home/sandbox"
SCRATCH_DIRS = (WORK_DIR, "/tmp", "/mnt", "/dev/shm")
_SCRATCH_PREFIXES = tuple(top + "/" for top in SCRATCH_DIRS)


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
