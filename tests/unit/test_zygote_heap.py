"""How the zygote prepares its heap for forking: immortal objects, a filled allocator.

Each case runs in a fresh interpreter, since both change the heap of the process for good.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from tests.huge_pages import needs_thp
from tests.unit.fresh_interpreter import run_python

INSIDE_DIR = Path(__file__).resolve().parents[2] / "sandbox_service" / "jail" / "inside"

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
        from sandbox_service.jail.inside import heap as jail_heap
        heap = [(str(i), i * 2**40) for i in range(300_000)]
        gc.collect()
        before = anonymous_mib()
        changed = jail_heap.immortalize_heap()
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
        from sandbox_service.jail.inside import heap as jail_heap
        def outer():
            def inner():
                return 2.5
            return ("a constant tuple", 10**30), inner
        nested = next(c for c in outer.__code__.co_consts if hasattr(c, "co_code"))
        objects = [outer.__code__.co_consts, outer.__code__.co_consts[1], nested,
                   nested.co_consts[1], outer.__code__.co_linetable]
        jail_heap.immortalize_heap()
        print(*(sys.getrefcount(o) for o in objects))
        """
    )
    assert all(int(count) == 2**32 - 1 for count in out.split()), out


def test_after_the_fill_new_objects_stay_off_the_pages_of_old_ones() -> None:
    # Free blocks scattered among live objects: without the fill, a child's new objects go
    # there, a copy-on-write fault for a few objects per page.
    out = run_python(
        """
        from sandbox_service.jail.inside import heap as jail_heap
        def fresh_share(fill):
            live = [bytes(100) for _ in range(20_000)]
            freed_pages = {id(b) >> 12 for b in live[::2]}
            del live[::2]
            if fill:
                jail_heap.fill_allocator()
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
        from sandbox_service.jail.inside import heap as jail_heap
        stats = jail_heap._allocator_stats()
        assert stats is not None
        free_blocks, unused_pools = stats
        print(sorted(free_blocks) == list(range(16, 513, 16)), unused_pools >= 0)
        """
    )
    assert out == "True True"


def test_the_lean_preload_maps_no_library_its_programs_did_not_ask_for() -> None:
    # Every mapping of the zygote is copied by each fork and torn down by each exit (about 1.5 us
    # a mapping per call): reading the allocator's report through tempfile loaded shutil's
    # compressors (27 mappings) into the lean zygote. Loaded by path, as the
    # jail loads it (the host's sandbox_service imports these modules for its own use).
    out = run_python(
        f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location(
            "rl_sandbox_inside",
            "{INSIDE_DIR}/__init__.py",
            submodule_search_locations=["{INSIDE_DIR}"],
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules["rl_sandbox_inside"] = package
        spec.loader.exec_module(package)
        importlib.import_module("rl_sandbox_inside.pid1")
        importlib.import_module("rl_sandbox_inside.heap").prepare_heap(zygote="lean")
        loaded = {{"zlib", "_bz2", "_lzma", "shutil", "tempfile"}} & set(sys.modules)
        with open("/proc/self/maps") as maps:
            libraries = {{line.split()[-1].rsplit("/", 1)[-1].split(".so")[0] for line in maps}}
        print(sorted(loaded), sorted({{"libbz2", "liblzma"}} & libraries))
        """
    )
    assert out == "[] []", f"modules and libraries the lean preload loaded: {out}"


HEAP_MAPPING = """
def in_heap_mapping(objects):
    with open("/proc/self/maps") as f:
        low, high = next(
            (int(x, 16) for x in line.split()[0].split("-")) for line in f if "[heap]" in line
        )
    return sum(low <= id(o) < high for o in objects) / len(objects)
"""


def test_arenas_taken_inside_lie_in_the_heap_mapping_and_the_default_comes_back() -> None:
    # pymalloc maps each arena on its own, wherever the kernel finds room, often between two
    # libraries' mappings, where no huge page can ever back it. Inside, they come from malloc's
    # heap, one mapping that huge_pages collapses whole.
    out = run_python(
        ANONYMOUS_MIB
        + HEAP_MAPPING
        + textwrap.dedent("""
        import sys
        from sandbox_service.jail.inside import heap as jail_heap
        sys.setrecursionlimit(10_000)
        def deep(n):  # frames beyond the first chunks of the frame stack, taken there too
            return 0 if n == 0 else 1 + deep(n - 1)
        with jail_heap.contiguous_arenas() as taken:
            inside = [bytes(100) for _ in range(200_000)]
            deep(5_000)
        after = [bytes(100) for _ in range(100_000)]
        before_free = anonymous_mib()
        share_inside, share_after = in_heap_mapping(inside), in_heap_mapping(after)
        del inside  # arenas of the heap, now freed by the default allocator: unmapped
        freed = before_free - anonymous_mib()
        deep(5_000)
        again = [bytes(100) for _ in range(200_000)]
        print(taken, share_inside, share_after, freed, len(again))
        """)
    )
    taken, share_inside, share_after, freed_mib, again = out.split()
    assert taken == "True"
    assert float(share_inside) > 0.95, f"only {share_inside} of the arenas were in the heap"
    assert float(share_after) < 0.2, "the default allocator did not come back"
    assert float(freed_mib) > 10, f"freeing the heap's arenas returned {freed_mib} MiB"
    assert again == "200000"


def test_the_heap_walk_visits_every_reachable_object_once() -> None:
    out = run_python(
        """
        import gc
        from sandbox_service.jail.inside import heap as jail_heap
        untracked = "a string only a tuple holds " + str(12345)
        holder = [(untracked, 10**40)]
        gc.collect()
        walked = [id(obj) for obj in jail_heap.heap_objects()]
        print(len(walked) == len(set(walked)), id(untracked) in walked, id(holder[0][1]) in walked)
        """
    )
    assert out == "True True True"


def test_the_address_bitmap_tells_apart_objects_16_bytes_apart() -> None:
    from sandbox_service.jail.inside.heap import _AddressBitmap

    seen = _AddressBitmap()
    addresses = [0x7F00_0000_0000 + 16 * i for i in range(1000)] + [0x5555_0000_0010, 1 << 20]
    assert not any(seen.test_and_set(a) for a in addresses)
    assert all(seen.test_and_set(a) for a in addresses)
    assert not seen.test_and_set(0x7F00_0000_0000 + 16 * 1000)


@needs_thp
def test_the_interpreters_code_moves_onto_huge_pages_byte_for_byte() -> None:
    # Children fault a file's code in again after every fork; an anonymous copy on huge pages
    # is inherited whole. The copy must hold exactly the file's bytes, at the same addresses,
    # and the interpreter must go on running from it.
    out = run_python(
        textwrap.dedent("""
        import ctypes
        from sandbox_service.jail.inside import heap as jail_heap
        def file_mappings():
            rows = []
            with open("/proc/self/maps") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) > 5 and fields[5].startswith("/"):
                        low, high = (int(x, 16) for x in fields[0].split("-"))
                        rows.append((low, high, int(fields[2], 16), fields[5]))
            return rows
        ranges = jail_heap._interpreter_code_ranges()
        before = file_mappings()
        made = jail_heap.interpreter_code_on_huge_pages()
        # Each copied byte against the file, through the mapping that held it before.
        same, compared = True, 0
        for start, end in ranges:
            for low, high, offset, path in before:
                a, b = max(low, start), min(high, end)
                if a < b:
                    with open(path, "rb") as f:
                        f.seek(offset + a - low)
                        same &= f.read(b - a) == ctypes.string_at(a, b - a)
                    compared += b - a
        huge, where = 0, None
        with open("/proc/self/smaps") as f:
            for line in f:
                fields = line.split()
                if "-" in fields[0] and not fields[0].endswith(":"):
                    where = (int(fields[0].split("-")[0], 16), len(fields) == 5, fields[1])
                elif fields[0] == "AnonHugePages:" and any(where[0] == s for s, _ in ranges):
                    huge += int(fields[1]) * (where[1] and where[2] == "r-xp")
        import sympy  # the interpreter goes on, from the copy
        size = sum(e - s for s, e in ranges)
        print(made, size // 2**21, huge // 2048, same and compared == size, sympy.sqrt(16))
        """)
    )
    made, expected, huge, same, four = out.split()
    assert int(made) == int(expected) == int(huge) >= 1
    assert (same, four) == ("True", "4")
