"""How the zygote prepares its heap for forking: immortal objects, a filled allocator.

Each case runs in a fresh interpreter, since both change the heap of the process for good.
"""

from __future__ import annotations

import sys
import textwrap

import pytest

from tests.unit.fresh_interpreter import run_python

pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 12),
    reason="the zygote's heap preparation is for CPython 3.12",
)


ANONYMOUS_MIB = """
def anonymous_mib():
    with open("/proc/self/smaps_rollup") as f:
        return int(f.read().split("Anonymous:")[1].split()[0]) / 1024
"""


def test_immortalizing_the_heap_keeps_none_of_its_own_bookkeeping() -> None:
    # The walk remembers every object it visited; a set made before the snapshot of the heap is
    # in it, and its numbers were made immortal with the rest: about 30 MiB that stayed.
    out = run_python(
        ANONYMOUS_MIB
        + textwrap.dedent("""
        import gc
        from sandbox_service.jail import zygote
        heap = [(str(i), i * 2**40) for i in range(300_000)]
        gc.collect()
        before = anonymous_mib()
        changed = zygote.immortalize_heap()
        gc.collect()
        print(changed, anonymous_mib() - before)
        """)
    )
    changed, grown_mib = out.split()
    assert int(changed) >= 900_000
    assert float(grown_mib) < 8, f"the heap grew by {grown_mib} MiB"


def test_code_constants_and_nested_code_are_made_immortal() -> None:
    # The collector does not traverse code objects; every LOAD_CONST of a mortal constant in a
    # forked child would write its reference count, a copy-on-write fault.
    out = run_python(
        """
        import sys
        from sandbox_service.jail import zygote
        def outer():
            def inner():
                return 2.5
            return ("a constant tuple", 10**30), inner
        nested = next(c for c in outer.__code__.co_consts if hasattr(c, "co_code"))
        objects = [outer.__code__.co_consts, outer.__code__.co_consts[1], nested,
                   nested.co_consts[1], outer.__code__.co_linetable]
        zygote.immortalize_heap()
        print(*(sys.getrefcount(o) for o in objects))
        """
    )
    assert all(int(count) == 2**32 - 1 for count in out.split()), out


def test_after_the_fill_new_objects_stay_off_the_pages_of_old_ones() -> None:
    # Free blocks scattered among live objects: without the fill, a child's new objects go
    # there, a copy-on-write fault for a few objects per page.
    out = run_python(
        """
        from sandbox_service.jail import zygote
        def fresh_share(fill):
            live = [bytes(100) for _ in range(20_000)]
            freed_pages = {id(b) >> 12 for b in live[::2]}
            del live[::2]
            if fill:
                zygote.fill_allocator()
            new = [bytes(100) for _ in range(5_000)]
            return sum((id(b) >> 12) not in freed_pages for b in new) / len(new), live
        unfilled, keep = fresh_share(fill=False)
        filled, keep2 = fresh_share(fill=True)
        print(unfilled, filled)
        """
    )
    unfilled, filled = (float(x) for x in out.split())
    assert unfilled < 0.5, "the scattered free blocks were not reused: the test shows nothing"
    assert filled > 0.99, f"only {filled:.1%} of new objects landed on fresh pages"


def test_the_allocator_report_is_read() -> None:
    out = run_python(
        """
        from sandbox_service.jail import zygote
        stats = zygote._allocator_stats()
        assert stats is not None
        free_blocks, unused_pools = stats
        print(sorted(free_blocks) == list(range(16, 513, 16)), unused_pools >= 0)
        """
    )
    assert out == "True True"
