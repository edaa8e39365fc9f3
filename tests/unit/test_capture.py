"""The head-and-tail cut of a program's output (sandbox_service/jail/capture.py); no service."""

from __future__ import annotations

import os
import re

import pytest

from sandbox_service.jail.capture import CappedBuffer

MARKER = re.compile(rb"\n\[\.\.\. (\d+) bytes omitted \.\.\.\]\n")


def fed(data: bytes, cap: int, chunk: int) -> CappedBuffer:
    buffer = CappedBuffer(cap)
    for start in range(0, len(data), chunk):
        buffer.feed(data[start : start + chunk])
    return buffer


@pytest.mark.parametrize("chunk", [1, 7, 100, 5000])
def test_output_under_the_cap_is_kept_whole(chunk: int) -> None:
    data = bytes(range(256)) * 3
    buffer = fed(data, cap=768, chunk=chunk)
    assert buffer.kept() == data and not buffer.truncated and buffer.total == 768


@pytest.mark.parametrize("chunk", [1, 13, 999, 70000])
def test_a_cut_keeps_head_and_tail_and_names_what_it_left_out(chunk: int) -> None:
    data = b"".join(b"line %06d\n" % i for i in range(20000))  # 240,000 bytes
    buffer = fed(data, cap=1000, chunk=chunk)
    kept = buffer.kept()
    assert buffer.truncated and buffer.total == len(data)
    assert len(kept) == 1000  # ASCII: the cut fills the cap exactly
    marker = MARKER.search(kept)
    assert marker is not None
    head, tail = kept[: marker.start()], kept[marker.end() :]
    assert data.startswith(head) and data.endswith(tail)
    assert int(marker.group(1)) == len(data) - len(head) - len(tail)
    # The split: half of what the marker leaves to each side.
    assert abs(len(head) - len(tail)) <= 1 and len(head) + len(tail) >= 1000 - len(marker[0])


def test_cuts_never_split_a_character() -> None:
    data = "é€😀".encode() * 5000
    for cap in range(60, 90):
        kept = fed(data, cap=cap, chunk=333).kept()
        assert len(kept) <= cap
        kept.decode("utf-8")  # strict: no character cut in half


def test_a_cap_smaller_than_the_marker_keeps_the_head() -> None:
    buffer = fed(b"abcdefghij" * 10, cap=8, chunk=3)
    assert buffer.kept() == b"abcdefgh" and buffer.truncated and buffer.total == 100


def test_memory_stays_bounded_whatever_is_fed() -> None:
    buffer = CappedBuffer(4096)
    for _ in range(2000):
        buffer.feed(b"x" * 65536)
    assert buffer.total == 2000 * 65536
    assert len(buffer._head) <= 4096 and len(buffer._tail) <= 4096


def test_drain_tells_a_pipe_at_its_end_from_one_merely_empty_and_bounds_its_reads() -> None:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    try:
        buffer = CappedBuffer(1 << 20)
        os.write(write_end, b"abc")
        assert buffer.drain(read_end) is False  # empty now, but its writer may write more
        assert buffer.kept() == b"abc"
        os.write(write_end, b"x" * (1 << 16))
        assert buffer.drain(read_end, reads=1) is False  # one read, the pipe not yet at its end
        os.close(write_end)
        write_end = -1
        assert buffer.drain(read_end) is True
        assert buffer.total == 3 + (1 << 16)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
