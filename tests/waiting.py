"""Polling for a condition that another process or thread makes true."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    """Return once `condition()` is true; fail the test naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never {what} in {timeout_s} s"
        time.sleep(0.01)
