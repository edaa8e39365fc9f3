"""The pytest process's signal handlers, kept as a test found them.

An RQ worker run in the test process (`Worker.work`) installs its own SIGINT and SIGTERM
handlers and never puts the old ones back: a later signal to pytest (a stop, a timeout) then
raises `rq.exceptions.StopRequested` inside whatever test runs at that moment.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

_UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})


def signal_handlers() -> dict[signal.Signals, Handler]:
    """Every catchable signal's handler now (None: one installed outside Python)."""
    return {sig: signal.getsignal(sig) for sig in signal.valid_signals() if sig not in _UNCATCHABLE}


def changed_handlers(
    before: dict[signal.Signals, Handler], after: dict[signal.Signals, Handler]
) -> list[str]:
    """Names of the signals whose handler differs between the two snapshots."""
    return sorted(sig.name for sig in before if after.get(sig) is not before[sig])


def restore(before: dict[signal.Signals, Handler]) -> None:
    """Put back every handler that Python can put back (not those installed outside it)."""
    for sig, handler in before.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


@contextmanager
def kept_signal_handlers() -> Iterator[dict[signal.Signals, Handler]]:
    """The handlers as they were on entry, restored on exit whatever ran in between."""
    before = signal_handlers()
    try:
        yield before
    finally:
        restore(before)
