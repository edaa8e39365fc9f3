"""A session's members in one jail: one runs at a time, the others stopped with their scratch
mounts held aside (scratch.py); a fork makes copies of the running one.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import time
from dataclasses import dataclass

from .member import FORK, FORK_BATCH, FORK_HELLO_DEADLINE_S, HELLO
from .process import (
    REAP_DEADLINE_S,
    _is_dumpable,
    _is_stopped,
    _kill_all_but,
    _parent_of,
)
from .protocol import send_frame
from .scratch import (
    detach_roots,
    drop_snapshot,
    forget,
    freeze,
    put_in_place,
    set_aside,
    thaw,
)


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
    snapshot: int | None = None
    """A fork not run yet: the snapshot of its parent's files it gets at its first turn."""
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


MAX_MEMBERS = 4096
_UCRED = struct.Struct("3i")


class _Family:
    """The interpreters of one session jail: one, until the session is forked.

    Forks are copies of a member's process (copy-on-write); they share the jail, its memory and
    process limits. Only one member runs at a time: the others are stopped (SIGSTOP) and their
    scratch mounts held aside, so a member never sees a sibling's later state or files; a member
    whose turn comes gets its own mounts back (docs/service.md, "Forked sessions").
    """

    def __init__(self, first: _Member) -> None:
        self.members: dict[int, _Member] = {0: first}
        self.current: int | None = 0
        """The member whose files are in the scratch directories and that is not stopped."""
        self._next = 1
        self._waiting: dict[int, int] = {}
        """Snapshot -> the forks still to get a copy of it."""
        self._next_snapshot = 0

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
        # The leaving member's mounts are held aside as they are (an ended member's detached);
        # the arriving member's own mounts come back: nothing is copied either way. A mount
        # that cannot be moved leaves the roots in no known state: the jail ends (RuntimeError).
        try:
            if self.current is not None and self.current in self.members:
                set_aside(self.current)
            else:
                detach_roots()
            self.current = None
            self._put_in_place(key)
        except OSError as exc:
            raise RuntimeError(f"the scratch mounts could not be switched: {exc}") from exc
        arriving = self.members[key]
        arriving.moved = True  # its working directory's path crossed mounts: enter it again
        self.current = key
        with contextlib.suppress(ProcessLookupError):
            os.kill(arriving.pid, signal.SIGCONT)

    def _put_in_place(self, key: int) -> None:
        """Member `key`'s mounts onto the bare roots: its own, or at its first turn a copy of
        the snapshot it was forked with."""
        member = self.members[key]
        snapshot = member.snapshot
        if snapshot is None:
            put_in_place(key)
            return
        member.snapshot = None
        self._waiting[snapshot] -= 1
        last = self._waiting[snapshot] == 0
        if last:
            del self._waiting[snapshot]
        thaw(snapshot, last)

    def _forget_snapshot_of(self, member: _Member) -> None:
        snapshot = member.snapshot
        if snapshot is None:
            return
        member.snapshot = None
        self._waiting[snapshot] -= 1
        if self._waiting[snapshot] == 0:
            del self._waiting[snapshot]
            drop_snapshot(snapshot)

    def end_dumpable(self) -> list[int]:
        """End every member the kernel says is dumpable while it has siblings (they share its
        uid: its memory would be theirs to read and write); the keys ended. Every copy is made
        non-dumpable (_fork_interpreter): only the program can have made one dumpable again."""
        if len(self.members) < 2:
            return []
        ended = [key for key, member in self.members.items() if _is_dumpable(member.pid)]
        for key in ended:
            self.drop(key)
        return ended

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
            self._forget_snapshot_of(member)
        if key == self.current:
            self.current = None  # its mounts stay on the roots until the next member's turn
        forget(key)  # its held mounts, or the empty places of the mounts on the roots

    def fork(self, key: int, n: int) -> list[int]:
        """Fork member `key` n times; the new members' keys (stopped, each to get a copy of its
        files, frozen now, on mounts of its own at its first turn). Raises RuntimeError when a
        copy does not come or the files cannot be frozen (what was made is dropped)."""
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
            _kill_all_but(*self.pids())  # copies that never said hello, the middle
            raise
        # As after a cell: nothing of the jail outlives the fork but its members.
        _kill_all_but(*self.pids())
        snapshot = self._next_snapshot
        self._next_snapshot += 1
        try:
            freeze(snapshot)
        except OSError as exc:
            for new in made:
                self.drop(new)
            drop_snapshot(snapshot)
            raise RuntimeError(str(exc)) from exc
        self._waiting[snapshot] = len(made)
        for new in made:
            self.members[new].snapshot = snapshot
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
