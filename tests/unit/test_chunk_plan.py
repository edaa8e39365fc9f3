"""Which calls of a request share a queue job (api/chunking.py) and a chunk's wire form (pure)."""

from __future__ import annotations

import math

from sandbox_service.api.chunking import plan_chunks
from sandbox_service.jobs import JobPayload, chunk_from_wire, chunk_to_wire, item_id, job_of


def calls(n: int, **fields: object) -> list[JobPayload]:
    return [JobPayload(code=f"print({i})", **fields) for i in range(n)]  # type: ignore[arg-type]


def test_a_batch_of_64_on_two_workers_is_four_chunks_of_16_in_order() -> None:
    plan = plan_chunks(calls(64), workers=2, per_worker=2)
    assert plan == [list(range(start, start + 16)) for start in range(0, 64, 16)]


def test_no_chunk_without_live_workers_or_more_calls_than_chunks() -> None:
    assert plan_chunks(calls(8), workers=0) == [[i] for i in range(8)]
    assert plan_chunks(calls(4), workers=2, per_worker=2) == [[0], [1], [2], [3]]
    assert plan_chunks(calls(1), workers=2) == [[0]]


def test_session_cells_stay_jobs_of_their_own_and_groups_never_share_a_chunk() -> None:
    payloads = [
        JobPayload(code="a", group="g"),
        JobPayload(code="b"),
        JobPayload(code="c", session_id="s"),
        JobPayload(code="d", group="g"),
        JobPayload(code="e"),
        JobPayload(code="f", group="g"),
        JobPayload(code="g"),
    ]
    plan = plan_chunks(payloads, workers=1, per_worker=2)
    assert sorted(i for job in plan for i in job) == list(range(7))
    assert [2] in plan
    for job in plan:
        assert len({payloads[i].group for i in job}) == 1, plan
        assert len(job) == 1 or all(payloads[i].session_id is None for i in job)
    assert len(plan) < len(payloads)


def test_a_chunk_round_trips_its_calls_and_budgets_and_its_ids_name_the_job() -> None:
    items = tuple(calls(3, reply_to="r", group="t/g", deadline=5.0))
    wire = chunk_to_wire(items, (11.0, 12.0, 13.0))
    assert chunk_from_wire(wire) == list(zip(items, (11.0, 12.0, 13.0), strict=True))
    assert chunk_from_wire(items[0].to_wire()) is None
    assert job_of(item_id("abc", 7)) == "abc"
    assert job_of("abc") == "abc"
    assert item_id("abc", 0) != item_id("abc", 1)


def test_a_chunk_taken_in_time_has_no_late_call_and_one_taken_late_keeps_its_deadlines() -> None:
    items = (JobPayload(code="a", start_by=100.0), JobPayload(code="b", start_by=50.0))
    wire = chunk_to_wire(items, (1.0, 1.0))
    taken = chunk_from_wire(wire, dequeued_at=60.0)
    assert taken is not None
    assert [payload.start_by for payload, _ in taken] == [math.inf, 50.0]
    assert [payload.code for payload, _ in taken] == ["a", "b"]
    assert wire["k"][0]["sb"] == 100.0  # the job's own record is left as it was
