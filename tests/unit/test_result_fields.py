"""One definition of a result: the internal record (ExecutionResult) and the wire model
(ExecuteResult) agree field for field, and statuses are one enum on both sides and in OpenAPI."""

from __future__ import annotations

import base64
import dataclasses

from sandbox_service.execution import CompileOutcome, ExecutionResult, Status
from sandbox_service.jobs import INTERNAL_FIELDS, WIRE_NAMES, result_to_wire
from trainer_client.wire import ExecuteResult


def _wire_names() -> set[str]:
    return {
        WIRE_NAMES.get(f.name, f.name)
        for f in dataclasses.fields(ExecutionResult)
        if f.name not in INTERNAL_FIELDS
    }


def test_the_wire_model_has_exactly_the_record_fields() -> None:
    assert set(ExecuteResult.model_fields) == _wire_names()


def test_a_full_record_round_trips_through_the_wire_model() -> None:
    record = ExecutionResult(
        status=Status.MEMORY_LIMIT, exit_code=None, signal=9, stdout="a", stderr="b",
        stdout_truncated=True, stderr_truncated=False, stdout_bytes=70000, stderr_bytes=1,
        wall_time=1.5, cpu_time=0.25,
        peak_memory_mb=12.5, files={"out.bin": b"\x00\xff"}, execution_id="e1",
        queue_time=0.125, restored=True,
    )  # fmt: skip
    wire = result_to_wire(record)
    model = ExecuteResult.model_validate(wire)
    assert model.model_dump(mode="json") == wire
    assert model.id == "e1" and model.status is Status.MEMORY_LIMIT
    assert base64.b64decode(model.files["out.bin"]) == b"\x00\xff"
    assert model.restored is True and model.queue_time == 0.125


def test_internal_fields_travel_only_when_set() -> None:
    assert "ended" not in result_to_wire(ExecutionResult(Status.OK), "e")
    assert result_to_wire(ExecutionResult(Status.OK, ended=False), "e")["ended"] is False


def test_statuses_are_an_enum_in_the_openapi_schema() -> None:
    schema = ExecuteResult.model_json_schema()
    status = schema["properties"]["status"]
    ref = status["$ref"].rsplit("/", 1)[-1]
    assert schema["$defs"][ref]["enum"] == [s.value for s in Status]


def test_a_compile_step_round_trips_through_the_wire_model() -> None:
    step = CompileOutcome(Status.ERROR, exit_code=1, stderr="main.cpp:1: error", wall_time=0.5)
    wire = result_to_wire(ExecutionResult(Status.ERROR, exit_code=1, compile=step), "e")
    model = ExecuteResult.model_validate(wire)
    assert model.model_dump(mode="json") == wire
    assert model.compile is not None and model.compile.status is Status.ERROR
    assert (model.compile.stderr, model.compile.cached) == ("main.cpp:1: error", False)
