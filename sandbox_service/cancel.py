"""A cancellation requested by one thread and obeyed by the run of another (pure: no I/O).

The worker's cancel watcher requests it when the client of the running job went away or its group
was cancelled (both answer `cancelled`); the jail
attaches its abort while a program runs. Requesting and attaching take one lock, so an abort is
either sent while the program runs or, when requested before, the moment the program starts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

CLIENT_LEFT = "client"
"""Cancel reason (the job's cancel marker): the client of the request went away."""
GROUP_CANCELLED = "group"
"""Cancel reason: the job's group was cancelled (POST /groups/{group}/cancel)."""
_WHY = {CLIENT_LEFT: "the client went away", GROUP_CANCELLED: "its group was cancelled"}

KILLED_NOTE = (
    "\ncancelled: the program was killed (its group was cancelled or its client went away)"
)
"""Appended to the stderr of a program killed because it was cancelled."""
NEVER_RAN = "cancelled: the client went away before the program started; it never ran"
"""The stderr of a cancelled job that was dequeued (or about to start) but never run."""


def never_ran(reason: str) -> str:
    """The stderr of a job cancelled for `reason` (a marker's value) before it started."""
    why = _WHY.get(reason, "it was cancelled")
    return f"cancelled: {why} before the program started; it never ran"


class Cancel:
    """One job's cancellation: `request()` from any thread; `attach(abort)` while it runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requested = False
        self._abort: Callable[[], None] | None = None

    @property
    def requested(self) -> bool:
        """Whether cancellation was requested."""
        return self._requested

    def request(self) -> None:
        """Cancel: abort the attached run now, or the next one attached."""
        with self._lock:
            if self._requested:
                return
            self._requested = True
            if self._abort is not None:
                self._abort()

    def attach(self, abort: Callable[[], None]) -> None:
        """A run started: `abort` ends it (called at once when cancellation came before)."""
        with self._lock:
            self._abort = abort
            if self._requested:
                abort()

    def detach(self) -> None:
        """The run ended: no abort is sent after this returns."""
        with self._lock:
            self._abort = None
