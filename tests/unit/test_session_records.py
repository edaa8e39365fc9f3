"""Session cells as stored in Redis for replay: every input survives the round trip."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from sandbox_service.broker.session_store import decode_cell, encode_cell, estimated_record_bytes
from sandbox_service.execution import ExecutionSpec, RecordedCell

any_text = st.text(st.characters(codec=None, exclude_categories=()))  # lone surrogates too


@given(
    code=any_text,
    stdin=any_text,
    files=st.dictionaries(st.text(min_size=1, max_size=20), st.binary(max_size=64), max_size=3),
    seed=st.none() | st.integers(0, 2**32 - 1),
)
def test_a_cell_survives_encoding(
    code: str, stdin: str, files: dict[str, bytes], seed: int | None
) -> None:
    cell = RecordedCell(code=code, stdin=stdin, files=files, seed=seed)
    assert decode_cell(encode_cell(cell)) == cell


def test_the_record_of_a_cell_keeps_its_inputs_not_its_limits_or_fetches() -> None:
    spec = ExecutionSpec(
        code="x = input()", stdin="7\n", files={"a.txt": b"A"}, fetch_files=("out.txt",)
    )
    assert RecordedCell.of(spec) == RecordedCell("x = input()", "7\n", {"a.txt": b"A"})


def test_the_record_of_a_seeded_cell_keeps_its_seed() -> None:
    assert RecordedCell.of(ExecutionSpec(code="x", seed=0)).seed == 0
    # Records written before seeds existed read as unseeded.
    assert decode_cell(b'{"code": "x", "stdin": "", "files": {}}') == RecordedCell("x")


@given(
    code=st.text(st.characters(max_codepoint=126, min_codepoint=32), max_size=200),
    stdin=st.text(st.characters(max_codepoint=126, min_codepoint=32), max_size=200),
    files=st.dictionaries(
        st.from_regex(r"[a-z]{1,12}\.txt", fullmatch=True), st.binary(max_size=300), max_size=3
    ),
)
def test_the_apis_estimate_of_a_record_is_its_size_give_or_take_escapes(
    code: str, stdin: str, files: dict[str, bytes]
) -> None:
    # What the API charges before a cell runs (from the request's base64 files) against what the
    # worker stores: equal but for JSON's escapes of quotes and backslashes, two bytes each.
    cell = RecordedCell(code=code, stdin=stdin, files=files)
    b64 = {path: base64.b64encode(data).decode() for path, data in files.items()}
    escapes = sum(text.count('"') + text.count("\\") for text in (code, stdin))
    stored = len(encode_cell(cell))
    estimate = estimated_record_bytes(code, stdin, b64)
    assert stored - escapes <= estimate <= stored + 8
