"""The pure modules: codecs and checks, in milliseconds, and free of I/O libraries."""

from __future__ import annotations

import base64
import subprocess
import sys

from sandbox_service import keys
from sandbox_service.api.validation import check_batch, check_request, decoded_size
from sandbox_service.execution import ExecutionResult, Limits, Status
from sandbox_service.jobs import (
    INLINE_RESULT_MAX_BYTES,
    JobPayload,
    decode_notice,
    encode_notice,
    encode_result,
    failure_result,
    result_to_wire,
)
from sandbox_service.settings import Settings
from trainer_client.wire import BatchRequest, ExecuteRequest

PURE_MODULES = [
    "sandbox_service.jobs",
    "sandbox_service.keys",
    "sandbox_service.api.validation",
    "sandbox_service.execution",
    "trainer_client.wire",
    "sandbox_service.settings",
]


def test_pure_modules_import_no_io_library() -> None:
    probe = (
        f"import sys; import {', '.join(PURE_MODULES)}; "
        "print(sorted(m for m in ('fastapi', 'rq', 'redis', 'httpx', 'uvicorn') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_payload_round_trips_and_builds_the_spec() -> None:
    payload = JobPayload(
        code="print(1)", stdin="in", timeout_s=2.5, memory_mb=256,
        files={"a/b.txt": base64.b64encode(b"hi").decode()}, fetch_files=("out",),
        request_id="r1", reply_to="q:reply:x", admitted_at=1.0, start_by=61.0, attempt=2,
    )  # fmt: skip
    assert JobPayload.from_wire(payload.to_wire()) == payload
    assert JobPayload.from_wire(JobPayload(code="x").to_wire()) == JobPayload(code="x")
    spec = payload.to_spec("job-1", Limits(max_output_bytes=100))
    assert spec.files == {"a/b.txt": b"hi"} and spec.fetch_files == ("out",)
    assert (spec.limits.timeout_s, spec.limits.memory_mb) == (2.5, 256)
    assert spec.limits.max_output_bytes == 100 and spec.execution_id == "job-1"
    retried = payload.retried(now=100.0, queue_deadline_s=60.0)
    assert (retried.attempt, retried.start_by) == (3, 160.0)


def test_session_payloads_round_trip_and_get_the_largest_budget() -> None:
    cell = JobPayload(code="x", timeout_s=2.0, session_id="s:1")
    end = JobPayload(code="", session_id="s:1", end_session=True)
    assert JobPayload.from_wire(cell.to_wire()) == cell
    assert JobPayload.from_wire(end.to_wire()) == end
    assert cell.budget_timeout_s(60.0) == 60.0  # it may replay the session first
    assert JobPayload(code="x", timeout_s=2.0).budget_timeout_s(60.0) == 2.0


def test_session_keys_cannot_name_each_other() -> None:
    assert keys.session("q", "a:cells") != keys.session_cells("q", "a")
    assert keys.queue_worker("q", keys.worker_queue("q", "host:0:12")) == "host:0:12"
    assert keys.queue_worker("q", "q") is None


def test_notices_carry_small_results_inline_and_point_to_large_ones() -> None:
    small = result_to_wire(ExecutionResult(Status.OK, exit_code=0, stdout="1\n"), "j1")
    execution_id, inline = decode_notice(encode_notice("j1", encode_result(small)))
    assert (execution_id, inline) == ("j1", small)
    large = failure_result(Status.ERROR, "e" * (INLINE_RESULT_MAX_BYTES + 1), "j2")
    assert decode_notice(encode_notice("j2", encode_result(large))) == ("j2", None)


def test_result_files_are_base64() -> None:
    result = ExecutionResult(Status.OK, files={"out.bin": b"\x00\xff"})
    assert result_to_wire(result, "j")["files"] == {"out.bin": "AP8="}


def test_decoded_size_matches_base64() -> None:
    for n in range(10):
        assert decoded_size(base64.b64encode(b"x" * n).decode()) == n


def test_limits_are_checked_with_the_field_named() -> None:
    settings = Settings(max_code_bytes=10, max_timeout=5, max_memory_mb=64, max_files_bytes=3)
    request = ExecuteRequest(
        code="x" * 11, timeout=6, memory_mb=65, files={"f": base64.b64encode(b"abcd").decode()}
    )
    locs = [p["loc"] for p in check_request(request, settings, ("body",))]
    assert locs == [["body", "code"], ["body", "timeout"], ["body", "memory_mb"], ["body", "files"]]
    batch = BatchRequest(requests=[ExecuteRequest(code="ok", timeout=1, memory_mb=32), request])
    assert check_batch(batch, settings)[0]["loc"] == ["body", "requests", 1, "code"]
    too_many = BatchRequest(requests=[ExecuteRequest(code="1")] * 3)
    assert check_batch(too_many, Settings(max_batch=2))[0]["loc"] == ["body", "requests"]
