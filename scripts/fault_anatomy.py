"""What a forked child's page faults land on: the preloaded heap's objects, by type.

Builds the zygote's heap outside the jail with zygote.prepare_heap, as zygote.main does, forks
children as it does (fork_lean) that each run the program, records every minor fault of the
whole run with `perf record -e minor-faults -c 1 -d` (perf re-runs this script under it), and
maps each fault address of the children to the preloaded object that holds it, or to the
mapping it falls in.
Needs root and perf.

    .venv/bin/python scripts/fault_anatomy.py [--children 6] [--code 'import sympy ...']
        [--no-fill] [--no-immortal] [--no-contiguous] [--no-huge-code]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SYMPY_SOLVE = "import sympy as sp\nx = sp.symbols('x')\nprint(sp.solve((x - {a}) * (x - {b}), x))"


def object_map() -> list[tuple[int, int, str]]:
    """(address, size, type name) of every object the zygote's walk reaches, by address."""
    from sandbox_service.jail.inside import heap

    rows = []
    for obj in heap.heap_objects():
        try:
            size = sys.getsizeof(obj)
        except TypeError:
            size = 16
        rows.append((id(obj), size, type(obj).__name__))
    return sorted(rows)


def mappings() -> list[tuple[int, int, str]]:
    rows = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        low, high = (int(x, 16) for x in fields[0].split("-"))
        name = fields[5].rsplit("/", 1)[-1] if len(fields) > 5 else "[anon]"
        rows.append((low, high, f"{name} {fields[1]}"))
    return rows


def inner(args: argparse.Namespace, out: Path) -> None:
    from sandbox_service.jail.inside import heap, libc

    heap.prepare_heap(
        contiguous=not args.no_contiguous,
        immortal=not args.no_immortal,
        fill=not args.no_fill,
        huge_code=not args.no_huge_code,
    )
    children = []
    for i in range(args.children):
        pid = libc.fork_lean()  # as the zygote forks its standbys
        if pid == 0:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
            exec(args.code.format(a=i + 2, b=i + 9), {"__name__": "__main__"})
            os._exit(0)
        os.waitpid(pid, 0)
        children.append(pid)
    out.write_text(json.dumps({"children": children, "objects": object_map(), "maps": mappings()}))


def attribute(
    faults: list[int], objects: list[list[Any]], maps: list[list[Any]]
) -> collections.Counter[str]:
    starts = [row[0] for row in objects]
    kinds: collections.Counter[str] = collections.Counter()
    for address in faults:
        i = bisect.bisect_right(starts, address) - 1
        if i >= 0 and objects[i][0] <= address < objects[i][0] + objects[i][1]:
            kinds[objects[i][2]] += 1
            continue
        where = next((name for low, high, name in maps if low <= address < high), "?")
        kinds[f"(no object) {where}"] += 1
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=6)
    parser.add_argument("--code", default=SYMPY_SOLVE, help="{a} and {b} vary per child")
    parser.add_argument("--no-fill", action="store_true")
    parser.add_argument(
        "--no-huge-code", action="store_true", help="libpython's code stays the file's"
    )
    parser.add_argument("--no-immortal", action="store_true")
    parser.add_argument("--no-contiguous", action="store_true", help="arenas mapped one by one")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        inner(args, Path(args.inner))
        return
    with tempfile.TemporaryDirectory() as tmp:
        report, data = Path(tmp) / "report.json", Path(tmp) / "perf.data"
        subprocess.run(
            ["perf", "record", "-q", "-e", "minor-faults", "-c", "1", "-d", "-o", str(data),
             "--", sys.executable, __file__, *sys.argv[1:], "--inner", str(report)],
            check=True,
        )  # fmt: skip
        done = json.loads(report.read_text())
        script = subprocess.run(
            ["perf", "script", "-i", str(data), "-F", "pid,addr"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    children = set(done["children"])
    faults = [
        int(fields[1], 16)
        for fields in (line.split() for line in script.stdout.splitlines())
        if len(fields) == 2 and fields[0].isdigit() and int(fields[0]) in children
    ]
    kinds = attribute(faults, done["objects"], done["maps"])
    n = len(children)
    print(f"{len(faults) / n:.0f} minor faults per child ({n} children), by what they hit:")
    for kind, count in kinds.most_common(20):
        print(f"  {count / n:7.1f}  {kind}")


if __name__ == "__main__":
    main()
