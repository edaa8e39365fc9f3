"""Session cells as stored in Redis for replay: every input survives the round trip."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sandbox_service.broker.session_store import decode_cell, encode_cell
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
