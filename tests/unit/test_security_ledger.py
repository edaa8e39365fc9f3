"""docs/security.md's resource ledger: every row names a bound and either tests that exist
(`path::name`, or `::name` for another test of the same file) or says its test is still TBD."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_REF = re.compile(r"`(?:(tests/[\w/]+\.py))?::(\w+)`")


def _rows() -> list[list[str]]:
    text = (ROOT / "docs" / "security.md").read_text()
    section = text.split("\n## The resource ledger\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[1:]]


def test_every_row_names_its_bound_and_tests_that_exist() -> None:
    rows = _rows()
    assert len(rows) >= 25
    resources = [row[0] for row in rows]
    for kind in ("zygote", "API's answers", "recorded cells", "session capacity", "CPU"):
        assert any(kind in name for name in resources), kind
    for row in rows:
        assert len(row) == 6, row
        resource, _, _, bound, _, tests = row
        assert bound, resource
        refs = TEST_REF.findall(tests)
        assert refs or tests == "test: TBD", f"{resource}: no test named"
        path = None
        for file, name in refs:
            path = file or path
            assert path is not None, f"{resource}: ::{name} names no file"
            source = (ROOT / path).read_text()
            assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{path}::{name}"
