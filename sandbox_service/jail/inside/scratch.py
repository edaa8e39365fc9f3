"""A session member's scratch directories: its own tmpfs instances, moved, never copied.

The running member's four mounts sit on the scratch roots; every other member's are held under
protocol.MEMBERS_DIR_IN_JAIL (a tmpfs of the zygote's, mode 0700: no program reaches it), and
a switch moves the leaving member's mounts there and the arriving member's onto the roots
(mount(2) with MS_MOVE, eight calls). Nothing of a member's files passes through the zygote's
memory: their pages stay where the member wrote them, charged to the run cgroup, holes holes.

A fork freezes one snapshot of the parent's files (fresh mounts, copied in by a helper that is
the program: _as_program, its uid, its run cgroup); each copy gets its own mounts at its first
turn, copied from the snapshot by such a helper, the last one taking the snapshot's mounts
themselves. The copies a fork has to make are made by the program, each once, when needed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat

from . import protocol
from .libc import _libc
from .process import _PROGRAM, _as_program

_MS_MOVE = 8192
_MS_NOSUID_NODEV = 2 | 4
_MNT_DETACH = 2


def _roots() -> list[tuple[str, str]]:
    """(directory, tmpfs options) of each scratch root, as main() was told."""
    return list(_PROGRAM["scratch"])


def _held(key: int | str) -> list[str]:
    """Where member `key`'s mounts are held while another member runs (a str: a snapshot's)."""
    return [f"{protocol.MEMBERS_DIR_IN_JAIL}/{key}/{i}" for i in range(len(_roots()))]


def _snapshot_name(snapshot: int) -> str:
    return f"s{snapshot}"


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _move(source: str, target: str) -> None:
    _check(
        _libc().mount(source.encode(), target.encode(), None, _MS_MOVE, None),
        f"cannot move {source} to {target}",
    )


def set_aside(key: int) -> None:
    """Move the roots' mounts (member `key`'s) to its holding place."""
    os.makedirs(f"{protocol.MEMBERS_DIR_IN_JAIL}/{key}", mode=0o700, exist_ok=True)
    for (root, _options), held in zip(_roots(), _held(key), strict=True):
        with contextlib.suppress(FileExistsError):
            os.mkdir(held, 0o700)
        _move(root, held)


def put_in_place(key: int | str) -> None:
    """Move member `key`'s held mounts onto the roots (left bare by set_aside or detach)."""
    for (root, _options), held in zip(_roots(), _held(key), strict=True):
        _move(held, root)


def detach_roots() -> None:
    """Detach the roots' mounts with all they hold (a member that ended left them there)."""
    for root, _options in _roots():
        _check(_libc().umount2(root.encode(), _MNT_DETACH), f"cannot detach {root}")


def forget(key: int | str) -> None:
    """Detach member `key`'s held mounts, if it has any (it ended)."""
    for held in _held(key):
        with contextlib.suppress(OSError):
            if os.path.ismount(held):
                _libc().umount2(held.encode(), _MNT_DETACH)
            os.rmdir(held)
    with contextlib.suppress(OSError):
        os.rmdir(f"{protocol.MEMBERS_DIR_IN_JAIL}/{key}")


def freeze(snapshot: int) -> None:
    """Fresh held mounts for `snapshot`, holding a copy of the roots' files, written by the
    program (so charged to it); OSError when they could not be made."""
    name = _snapshot_name(snapshot)
    os.makedirs(f"{protocol.MEMBERS_DIR_IN_JAIL}/{name}", mode=0o700, exist_ok=True)
    targets = _held(name)
    for held, (_root, options) in zip(targets, _roots(), strict=True):
        with contextlib.suppress(FileExistsError):
            os.mkdir(held, 0o700)
        _mount_tmpfs(held, options)
    _copy_as_program([root for root, _options in _roots()], targets)


def thaw(snapshot: int, last: bool) -> None:
    """Put a copy of `snapshot` on the bare roots: its own mounts when `last` (no copy; the
    snapshot is gone), else fresh mounts with its files copied in by the program."""
    name = _snapshot_name(snapshot)
    if last:
        put_in_place(name)
        forget(name)
        return
    for root, options in _roots():
        _mount_tmpfs(root, options)
    _copy_as_program(_held(name), [root for root, _options in _roots()])


def drop_snapshot(snapshot: int) -> None:
    forget(_snapshot_name(snapshot))


def _mount_tmpfs(target: str, options: str) -> None:
    _check(
        _libc().mount(b"tmpfs", target.encode(), b"tmpfs", _MS_NOSUID_NODEV, options.encode()),
        f"cannot mount a tmpfs on {target}",
    )


def _copy_as_program(sources: list[str], targets: list[str]) -> None:
    opened: list[int] = []
    try:
        for path in (*sources, *targets):
            opened.append(os.open(path, os.O_RDONLY | os.O_DIRECTORY))
        # Opened here: the program's uid cannot reach the holding place by path.
        pairs = list(zip(opened[: len(sources)], opened[len(sources) :], strict=True))
        failure = _as_program(_copy_trees, pairs)
        if failure is not None:
            raise OSError(f"the files could not be copied: {failure}")
    finally:
        for fd in opened:
            os.close(fd)


def _copy_trees(pairs: list[tuple[int, int]]) -> None:
    for source, target in pairs:
        copy_tree(source, target)


def copy_tree(source: int, target: int) -> None:
    """Copy the tree under directory `source` into the empty directory `target` (both open
    descriptors): directories, regular files (their holes kept), symbolic links, FIFOs and
    hard links, with modes and times; no link followed. Iterative (any depth the kernel's
    path length allows). A directory or file of the caller's it cannot read is opened by
    granting itself access for the copy, taken back after."""
    seen: dict[tuple[int, int], str] = {}
    directories: list[tuple[str, os.stat_result]] = []
    granted: list[tuple[str, int]] = []
    pending = [""]
    try:
        while pending:
            relative = pending.pop()
            for name in _list(source, relative, granted):
                path = f"{relative}/{name}" if relative else name
                info = os.stat(path, dir_fd=source, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    os.mkdir(path, 0o700, dir_fd=target)
                    directories.append((path, info))
                    pending.append(path)
                    continue
                known = seen.get((info.st_dev, info.st_ino)) if info.st_nlink > 1 else None
                if known is not None:
                    os.link(known, path, src_dir_fd=target, dst_dir_fd=target)
                    continue
                if stat.S_ISREG(info.st_mode):
                    _copy_file(source, target, path, info)
                elif stat.S_ISLNK(info.st_mode):
                    os.symlink(os.readlink(path, dir_fd=source), path, dir_fd=target)
                elif stat.S_ISFIFO(info.st_mode):
                    os.mkfifo(path, 0o600, dir_fd=target)
                else:
                    continue  # sockets: nothing to copy
                if info.st_nlink > 1:
                    seen[(info.st_dev, info.st_ino)] = path
                _keep_metadata(target, path, info)
        for path, info in reversed(directories):  # deepest first: a mode may shut its parent
            _keep_metadata(target, path, info)
    finally:
        for path, mode in reversed(granted):
            with contextlib.suppress(OSError):
                os.chmod(path, mode, dir_fd=source)


def _list(source: int, relative: str, granted: list[tuple[str, int]]) -> list[str]:
    """The names in directory `relative`; one the caller cannot list or pass through gets
    u+rx until the copy ends (recorded in `granted`)."""
    if relative:
        mode = stat.S_IMODE(os.stat(relative, dir_fd=source, follow_symlinks=False).st_mode)
        if mode & 0o500 != 0o500:
            os.chmod(relative, mode | 0o500, dir_fd=source)
            granted.append((relative, mode))
    fd = os.open(relative or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=source)
    try:
        return sorted(os.listdir(fd))
    finally:
        os.close(fd)


def _copy_file(source: int, target: int, path: str, info: os.stat_result) -> None:
    flags = os.O_RDONLY | os.O_NOFOLLOW
    try:
        src = os.open(path, flags, dir_fd=source)
    except PermissionError:
        os.chmod(path, stat.S_IMODE(info.st_mode) | 0o400, dir_fd=source)
        try:
            src = os.open(path, flags, dir_fd=source)
        finally:
            os.chmod(path, stat.S_IMODE(info.st_mode), dir_fd=source)
    try:
        dst = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=target
        )
        try:
            os.ftruncate(dst, info.st_size)  # a hole, where no data is copied over it
            offset = 0
            while offset < info.st_size:
                try:
                    start = os.lseek(src, offset, os.SEEK_DATA)
                except OSError:  # ENXIO: only a hole is left
                    break
                end = os.lseek(src, start, os.SEEK_HOLE)
                os.lseek(dst, start, os.SEEK_SET)
                while start < end:
                    sent = os.sendfile(dst, src, start, end - start)
                    if sent == 0:
                        break
                    start += sent
                offset = end
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _keep_metadata(target: int, path: str, info: os.stat_result) -> None:
    if not stat.S_ISLNK(info.st_mode):
        os.chmod(path, stat.S_IMODE(info.st_mode), dir_fd=target)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns), dir_fd=target, follow_symlinks=False)
