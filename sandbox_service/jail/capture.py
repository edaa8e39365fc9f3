"""Capped capture of a program's stdout and stderr, read incrementally from pipes.

Everything is read so the program never blocks on a full pipe; only the first `cap` bytes are
kept, the rest is counted and discarded, so memory stays flat whatever the program prints.
"""

from __future__ import annotations

import os

CHUNK = 1 << 16


class CappedBuffer:
    """Bytes read from one pipe, at most `cap` of them kept."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._chunks: list[bytes] = []
        self._kept = 0
        self.truncated = False

    def feed(self, data: bytes) -> None:
        """Keep what fits under the cap; flag the rest."""
        room = self.cap - self._kept
        if room <= 0:
            self.truncated = self.truncated or bool(data)
            return
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        self._chunks.append(data)
        self._kept += len(data)

    def read_from(self, fd: int) -> bool:
        """Read what is available; False at end of file."""
        try:
            data = os.read(fd, CHUNK)
        except BlockingIOError:
            return True
        if not data:
            return False
        self.feed(data)
        return True

    def text(self) -> str:
        """The kept bytes as UTF-8, invalid sequences replaced."""
        return b"".join(self._chunks).decode("utf-8", errors="replace")
