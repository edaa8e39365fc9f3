"""Time for retry decisions: the event loop's clock, or a virtual one that never sleeps (tests)."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Clock(Protocol):
    """What the retry logic needs from time."""

    def now(self) -> float:
        """Monotonic seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` before a retry."""
        ...


class LoopClock:
    """Real time: the running event loop's monotonic clock."""

    def now(self) -> float:
        """The event loop's time."""
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        """Sleep for real."""
        await asyncio.sleep(seconds)


class VirtualClock:
    """Test mode: backoff waits return at once and advance virtual time; `sleeps` records them.

    Deadlines are checked against virtual time, so a test can run a call through its whole retry
    schedule, and past its deadline, in milliseconds and deterministically.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s
        self.sleeps: list[float] = []
        """Every backoff wait asked for, in order."""

    def now(self) -> float:
        """Virtual time: the start plus every sleep so far."""
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Advance virtual time; yield to the loop once so that other tasks run."""
        self.sleeps.append(seconds)
        self._now += seconds
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        """Move virtual time forward, as a slow response would."""
        self._now += seconds
