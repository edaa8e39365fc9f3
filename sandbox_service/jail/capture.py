"""Capped capture of a program's stdout and stderr, read incrementally from pipes.

Everything is read so the program never blocks on a full pipe. Past the cap, the first bytes
(a head buffer) and the last bytes (a tail buffer trimmed as it grows) are kept and everything
between is counted and discarded, so memory stays flat (at most twice the cap) whatever the
program prints. A cut text is the head, a marker naming how many bytes were left out, and the
tail, `cap` bytes at most in all: the head gets half of what the marker leaves, the tail the rest.
"""

from __future__ import annotations

import os

CHUNK = 1 << 16
OMISSION_MARKER = "\n[... {omitted} bytes omitted ...]\n"
"""Put between the head and the tail of a cut output; `omitted` counts the bytes left out."""


def _char_start(data: bytes, index: int) -> int:
    """The index of the first UTF-8 character that starts at or after `index` (skipping at most
    three continuation bytes: more is not UTF-8, and is kept as it is)."""
    i = index
    while i < len(data) and i < index + 3 and data[i] & 0xC0 == 0x80:
        i += 1
    return i


def _char_end(data: bytes, index: int) -> int:
    """`index`, or less so that data[:index] does not end inside a UTF-8 character."""
    index = min(index, len(data))
    j = index - 1
    while j > index - 4 and j >= 0 and data[j] & 0xC0 == 0x80:
        j -= 1
    if j < 0 or data[j] < 0x80 or data[j] & 0xC0 == 0x80:
        return index
    width = 2 if data[j] & 0xE0 == 0xC0 else 3 if data[j] & 0xF0 == 0xE0 else 4
    return j if j + width > index else index


def cut(head: bytes, tail: bytes, total: int, cap: int) -> bytes:
    """The kept form of an output of `total` bytes whose first bytes are `head` and last bytes
    `tail` (each at least `cap` long when total > cap): head, marker, tail, at most `cap` bytes.

    Cuts fall on UTF-8 character boundaries, so a cut never makes a replacement character.
    Below the marker's own size only the head is kept.
    """
    if total <= cap:
        return head[:total]
    marker_len = len(OMISSION_MARKER.format(omitted=total))  # at least the marker's length
    if cap - marker_len < 2:
        return head[: _char_end(head, cap)]
    while True:  # the count shrinks as more is kept: at most a digit or two less to give back
        room = cap - marker_len
        head_end = _char_end(head, room // 2)
        kept_tail = tail[_char_start(tail, len(tail) - (room - room // 2)) :]
        marker = OMISSION_MARKER.format(omitted=total - head_end - len(kept_tail)).encode()
        if len(marker) >= marker_len:
            return head[:head_end] + marker + kept_tail
        marker_len = len(marker)


class CappedBuffer:
    """Bytes read from one pipe: the first and the last `cap` of them kept, all counted."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        """Bytes the program wrote, kept or not."""

    @property
    def truncated(self) -> bool:
        """Whether the program wrote more than the cap (its output is cut)."""
        return self.total > self.cap

    def feed(self, data: bytes) -> None:
        """Count the bytes; keep them in the head while it has room, and the last ones."""
        before = self.total
        self.total += len(data)
        if before > self.cap:
            self._tail += data[-self.cap :]
            if len(self._tail) > self.cap:
                del self._tail[: len(self._tail) - self.cap]
        elif self.total > self.cap:  # the cap is passed now: everything before is in the head
            self._tail = bytearray((bytes(self._head) + data)[-self.cap :])
        room = self.cap - len(self._head)
        if room > 0:
            self._head += data[:room]

    def read_from(self, fd: int) -> bool:
        """Read what is available; False at end of file."""
        return self._read_once(fd) is not False

    def drain(self, fd: int, reads: int = 4) -> bool:
        """Read what the pipe holds (at most `reads` reads: a session's background process may
        still be writing); whether the pipe is at its end, not just empty."""
        for _ in range(reads):
            got = self._read_once(fd)
            if got is not True:
                return got is False
        return False

    def _read_once(self, fd: int) -> bool | None:
        """One non-blocking read: True with data, False at end of file, None when empty."""
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return None
        if not data:
            return False
        self.feed(data)
        return True

    def kept(self) -> bytes:
        """What is kept of the output: all of it, or its head and tail around the marker."""
        if not self.truncated:
            return bytes(self._head)
        return cut(bytes(self._head), bytes(self._tail), self.total, self.cap)

    def text(self) -> str:
        """The kept bytes as UTF-8, invalid sequences replaced."""
        return self.kept().decode("utf-8", errors="replace")
