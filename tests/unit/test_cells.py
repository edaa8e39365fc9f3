"""The pure placement rules of api/cells.py: a session's cell, and the cell for stateless work."""

from __future__ import annotations

from collections import Counter

from sandbox_service.api.cells import least_loaded, session_cell


def test_a_session_has_one_cell_whatever_the_process() -> None:
    ids = [f"default\x00session-{i}" for i in range(2000)]
    first = [session_cell(i, 3) for i in ids]
    assert first == [session_cell(i, 3) for i in ids]
    spread = Counter(first)
    assert set(spread) == {0, 1, 2}
    assert min(spread.values()) > 500  # about a third each
    assert all(session_cell(i, 1) == 0 for i in ids)


def test_stateless_work_goes_to_the_least_loaded_cell_up() -> None:
    assert least_loaded([0, 0], [2, 2], [True, True]) == 0
    assert least_loaded([3, 0], [2, 2], [True, True]) == 1
    assert least_loaded([4, 4], [2, 8], [True, True]) == 1  # load per live worker
    assert least_loaded([0, 9], [2, 2], [False, True]) == 1  # a cell down takes nothing
    assert least_loaded([0, 0], [0, 2], [True, True]) == 1  # nor one without workers
    assert least_loaded([0, 0], [0, 0], [False, True]) == 1  # no workers anywhere: a cell up
    assert least_loaded([0, 0], [0, 0], [False, False]) == 0  # nothing up: its 503
