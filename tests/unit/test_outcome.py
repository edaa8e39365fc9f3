"""The status table of sandbox_service.jail.outcome, row by row."""

from __future__ import annotations

import signal

import pytest

from sandbox_service.execution import Status
from sandbox_service.jail.capture import CappedBuffer
from sandbox_service.jail.outcome import RawOutcome, classify

MEM = Status.MEMORY_LIMIT
ERR = Status.ERROR
ENOMEM_LINE = "OSError: [Errno 12] Cannot allocate memory"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (RawOutcome(0, None, False, False), Status.OK),
        (RawOutcome(3, None, False, False), Status.ERROR),
        (RawOutcome(None, signal.SIGKILL, True, False), Status.TIMEOUT),
        (RawOutcome(None, signal.SIGKILL, False, True), Status.MEMORY_LIMIT),
        (RawOutcome(1, None, False, True), Status.MEMORY_LIMIT),
        (RawOutcome(0, None, False, True), Status.OK),
        (RawOutcome(None, signal.SIGXCPU, False, False, "", True), Status.TIMEOUT),
        # A SIGXCPU the program sent itself, below its CPU limit.
        (RawOutcome(None, signal.SIGXCPU, False, False, "", False), Status.KILLED),
        (RawOutcome(None, signal.SIGSYS, False, False), Status.KILLED),
        (RawOutcome(None, signal.SIGSEGV, False, False), Status.KILLED),
        (RawOutcome(1, None, False, False, "Traceback...\nMemoryError\n", False, 256, 256), MEM),
        (RawOutcome(1, None, False, False, "MemoryError: big\n\n", False, 255.5, 256), MEM),
        # A MemoryError printed or raised far below the limit, or with no peak to tell: error.
        (RawOutcome(1, None, False, False, "MemoryError\n", False, 12.0, 256), Status.ERROR),
        (RawOutcome(1, None, False, False, "MemoryError\n", False, None, 256), Status.ERROR),
        (RawOutcome(1, None, False, False, "print('MemoryError')\nValueError"), Status.ERROR),
        # An uncaught MemoryError that ended the program (the runner's record), wherever its peak.
        (RawOutcome(1, None, False, False, "MemoryError\n", False, 12.0, 256, True), MEM),
        (RawOutcome(0, None, False, False, "", False, 12.0, 256, True), Status.OK),
        # A tmpfs write refused at the limit without an OOM kill (ENOMEM from the system call).
        (RawOutcome(1, None, False, False, f"Traceback...\n{ENOMEM_LINE}\n", False, 72.6, 64), MEM),
        (RawOutcome(1, None, False, False, f"{ENOMEM_LINE}\n", False, 12.0, 64), ERR),
        (RawOutcome(1, None, False, False, "OSError: [Errno 28] No space", False, 64, 64), ERR),
        (RawOutcome(None, signal.SIGKILL, True, True), Status.TIMEOUT),
    ],
)
def test_classify(raw: RawOutcome, status: Status) -> None:
    assert classify(raw) == status


def test_capped_buffer_keeps_the_head_and_flags_the_rest() -> None:
    buf = CappedBuffer(10)
    buf.feed(b"hello ")
    assert not buf.truncated
    buf.feed(b"world and more")
    buf.feed(b"even more")
    assert buf.truncated
    assert buf.text() == "hello worl"


def test_capped_buffer_exact_fit_is_not_truncated() -> None:
    buf = CappedBuffer(4)
    buf.feed(b"abcd")
    buf.feed(b"")
    assert not buf.truncated and buf.text() == "abcd"


def test_capped_buffer_replaces_invalid_utf8() -> None:
    buf = CappedBuffer(100)
    buf.feed(b"a\xffb")
    assert buf.text() == "a\ufffdb"
