"""Every bound of the HTTP edge, without services: no request model takes a non-finite number,
the server's size limits name their field, and the 422 renderer renders any input as JSON."""

from __future__ import annotations

import base64
import json
import math
import typing
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from sandbox_service.api.compat.codejudge import BatchSubmission, Submission
from sandbox_service.api.compat.sandboxfusion import (
    InvalidRequest,
    RunCodeRequest,
    RunJupyterRequest,
    check_jupyter_request,
    to_execute_request,
)
from sandbox_service.api.invalid import MAX_ERRORS, rendered_errors
from sandbox_service.api.json_gate import MAX_DEPTH, body_problems, content_type_problem
from sandbox_service.api.validation import check_request
from sandbox_service.jail.inside.protocol import RunLimits, RunRequest
from sandbox_service.settings import Settings
from trainer_client.wire import (
    MAX_PATH_CHARS,
    MIN_TIMEOUT_S,
    BatchRequest,
    ExecuteRequest,
    VerifyItem,
    VerifyRequest,
)

MINIMAL: dict[type[BaseModel], dict[str, Any]] = {
    ExecuteRequest: {"code": "1"},
    BatchRequest: {"requests": [{"code": "1"}]},
    VerifyRequest: {"items": [{"answer": "1", "reference": "1"}]},
    VerifyItem: {"answer": "1", "reference": "1"},
    RunCodeRequest: {"code": "1", "language": "python"},
    RunJupyterRequest: {"cells": ["1"]},
    Submission: {"type": "python", "solution": "1"},
    BatchSubmission: {"submissions": [{"type": "python", "solution": "1"}]},
}
"""Every request model of every route, with a valid body each; a new model belongs here."""


def _is_number(annotation: Any) -> bool:
    """int, float, or an optional one (pydantic has already taken Annotated's metadata off)."""
    return any(arg in (int, float) for arg in typing.get_args(annotation) or (annotation,))


NUMBER_FIELDS = [
    (model, name)
    for model in MINIMAL
    for name, field in model.model_fields.items()
    if _is_number(field.annotation)
]


def test_the_models_have_the_number_fields_this_test_is_about() -> None:
    names = {f"{model.__name__}.{name}" for model, name in NUMBER_FIELDS}
    assert {"ExecuteRequest.timeout", "ExecuteRequest.memory_mb", "VerifyRequest.rel_tol"} <= names
    assert {"RunCodeRequest.run_timeout", "RunJupyterRequest.cell_timeout"} <= names


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"])
@pytest.mark.parametrize(
    ("model", "field"), NUMBER_FIELDS, ids=[f"{m.__name__}.{f}" for m, f in NUMBER_FIELDS]
)
def test_no_request_model_takes_a_non_finite_number(
    model: type[BaseModel], field: str, text: str
) -> None:
    body = json.dumps(MINIMAL[model])[:-1] + f', "{field}": {text}}}'
    with pytest.raises(ValidationError) as raised:
        model.model_validate_json(body)
    assert [e["loc"] for e in raised.value.errors()] == [(field,)]
    # The same number through FastAPI's path (json.loads, then Python objects).
    with pytest.raises(ValidationError):
        model.model_validate(json.loads(body))


@pytest.mark.parametrize("timeout", [0.0, 1e-4, MIN_TIMEOUT_S / 2, -1.0])
def test_a_timeout_under_the_floor_is_refused_on_every_route(timeout: float) -> None:
    for model, field in ((ExecuteRequest, "timeout"), (VerifyRequest, "timeout")):
        with pytest.raises(ValidationError):
            model.model_validate({**MINIMAL[model], field: timeout})
    settings = Settings()
    for field in ("total_timeout", "cell_timeout"):
        request = RunJupyterRequest.model_validate({"cells": ["1"], field: timeout})
        if field == "cell_timeout" and timeout == 0:
            check_jupyter_request(request, settings)  # 0: no limit of its own, as there
            continue
        with pytest.raises(InvalidRequest) as raised:
            check_jupyter_request(request, settings)
        assert raised.value.problems[0]["loc"] == ["body", field]
    ExecuteRequest.model_validate({"code": "1", "timeout": MIN_TIMEOUT_S})


def test_the_jail_accepts_the_extremes_the_api_accepts() -> None:
    """Floor of the timeout, longest paths, most fetched paths: what passes the API's checks
    (at the settings' allowed maxima) is a run request the jail's protocol takes."""
    settings = Settings(max_fetch_files=4096, max_path_bytes=4096)
    longest = ["a" * MAX_PATH_CHARS, "/home/sandbox/" + "b" * (MAX_PATH_CHARS - 14)]
    request = RunCodeRequest(code="1", language="python", fetch_files=longest * 2048)
    execute = to_execute_request(request, settings)
    limits = RunLimits(MIN_TIMEOUT_S, 1, 1, 16)
    wire = RunRequest(limits, fetch=tuple(execute.fetch_files)).to_wire()
    assert RunRequest.from_wire(json.loads(json.dumps(wire))).fetch == tuple(longest * 2048)
    with pytest.raises(ValidationError):  # one character more, in either form
        ExecuteRequest.model_validate({"code": "1", "fetch_files": ["a" * (MAX_PATH_CHARS + 1)]})
    with pytest.raises(InvalidRequest):
        to_execute_request(RunCodeRequest(code="1", language="python",
                                          fetch_files=[longest[1] + "b"]), settings)  # fmt: skip


SMALL = Settings(
    max_fetch_files=4, max_path_bytes=16, max_input_files=2, max_stdin_bytes=8, max_cells=3
)


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"fetch_files": ["a"] * 5}, "fetch_files", "5 paths; at most 4"),
        ({"fetch_files": ["é" * 9]}, "fetch_files", "18 bytes; at most 16"),
        ({"files": {f"f{i}": "" for i in range(3)}}, "files", "3 files; at most 2"),
        ({"files": {"a" * 17: ""}}, "files", "17 bytes; at most 16"),
        ({"stdin": "ü" * 5}, "stdin", "10 bytes; at most 8"),
    ],
)
def test_size_limits_name_their_field(fields: dict[str, Any], field: str, words: str) -> None:
    problems = check_request(ExecuteRequest.model_validate({"code": "1", **fields}), SMALL, ())
    assert [(p["loc"], words in p["msg"]) for p in problems] == [([field], True)], problems


def test_requests_at_the_size_limits_pass() -> None:
    at_limits = {
        "fetch_files": ["é" * 8] * 4,
        "files": {"a" * 16: "", "b": ""},
        "stdin": "ü" * 4,
    }
    assert check_request(ExecuteRequest.model_validate({"code": "1", **at_limits}), SMALL, ()) == []


def test_jupyter_cells_are_counted() -> None:
    with pytest.raises(InvalidRequest) as raised:
        check_jupyter_request(RunJupyterRequest(cells=["1"] * 4), SMALL)
    assert raised.value.problems[0]["loc"] == ["body", "cells"]
    check_jupyter_request(RunJupyterRequest(cells=["1"] * 3), SMALL)


@pytest.mark.parametrize("settings", [Settings(), SMALL, Settings(max_fetch_files=4096)])
def test_the_fetch_list_bound_holds_the_worst_accepted_list(settings: Settings) -> None:
    # A control character is the longest JSON escape per byte (\u0001), in either ensure_ascii.
    worst = ["\x01" * settings.max_path_bytes] * settings.max_fetch_files
    request = ExecuteRequest.model_validate({"code": "1", "fetch_files": worst})
    assert check_request(request, settings, ()) == []
    for ensure_ascii in (True, False):
        encoded = json.dumps(worst, ensure_ascii=ensure_ascii, separators=(",", ":"))
        assert len(encoded.encode()) <= settings.max_fetch_list_bytes()


@pytest.mark.parametrize("settings", [Settings(), SMALL, Settings(max_files_bytes=1000)])
def test_the_files_bound_holds_the_worst_accepted_files(settings: Settings) -> None:
    count = settings.max_input_files
    sizes = [settings.max_files_bytes // count + (i < settings.max_files_bytes % count)
             for i in range(count)]  # fmt: skip
    paths = [f"{i:05d}" + "\x01" * (settings.max_path_bytes - 5) for i in range(count)]
    contents = [base64.b64encode(b"x" * size).decode() for size in sizes]
    worst = dict(zip(paths, contents, strict=True))
    request = ExecuteRequest.model_validate({"code": "1", "files": worst})
    assert check_request(request, settings, ()) == []
    encoded = json.dumps(worst, separators=(",", ":"))
    assert len(encoded.encode()) <= settings.max_input_files_json_bytes()


@pytest.mark.parametrize(
    "value",
    [
        math.nan,
        math.inf,
        -math.inf,
        b"\xff\xfe{not utf-8",
        "\udc80 lone surrogate",
        10**5000,
        "x" * 10_000_000,
        list(range(1_000_000)),
        {f"k{i}": "\udc80" for i in range(10_000)},
        [[[[[[[[["deep"]]]]]]]]],
        ValueError("in ctx"),
        object(),
    ],
    ids=lambda v: type(v).__name__,
)
def test_the_422_renderer_renders_any_input_as_bounded_json(value: Any) -> None:
    errors = [{"type": "t", "loc": ("body", "x" * 5000), "msg": "m", "input": value,
               "ctx": {"error": value}}]  # fmt: skip
    rendered = rendered_errors(errors)
    text = json.dumps({"detail": rendered}, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")  # raises if an unencodable character is left
    assert len(text) < 8192, len(text)
    assert rendered[0]["loc"][0] == "body" and rendered[0]["msg"] == "m"


def test_the_422_renderer_keeps_small_inputs_and_counts_the_errors_it_drops() -> None:
    errors = [{"type": "t", "loc": ("body", i), "msg": "m", "input": i / 2} for i in range(500)]
    rendered = rendered_errors(errors)
    assert rendered[:3] == [{"type": "t", "loc": ["body", i], "msg": "m", "input": i / 2}
                            for i in range(3)]  # fmt: skip
    assert len(rendered) == MAX_ERRORS + 1
    assert f"{500 - MAX_ERRORS} more errors" in rendered[-1]["msg"]


@pytest.mark.parametrize(
    ("body", "kind", "loc"),
    [
        (b'{"a": "\\udc80"}', "lone_surrogate", ["body", "a"]),
        (b'{"a": [1, {"\\ud800": 1}]}', "lone_surrogate", ["body", "a", 1, "\\ud800"]),
        (b"[" * 50_000 + b"]" * 50_000, "too_deep", ["body"]),
        (b'{"a": NaN}', "number_not_finite", ["body", "a"]),
        (b'{"a": [-Infinity]}', "number_not_finite", ["body", "a", 0]),
        (b'{"a": 1e999}', "number_not_finite", ["body", "a"]),
        (b'{"a": ' + b"9" * 1001 + b"}", "number_too_long", ["body", "a"]),
        (b'{"a": ' + b"9" * 5000 + b"}", "number_too_long", ["body", "a"]),
        (b'{"a": 1, "b": {"c": 1, "c": 2}}', "duplicate_key", ["body", "b", "c"]),
        (b'{"a": "\xff"}', "json_invalid", ["body"]),
        (b'{"a": ', "json_invalid", ["body"]),
    ],
)
def test_the_json_gate_refuses_each_odd_body_naming_its_place(
    body: bytes, kind: str, loc: list[Any]
) -> None:
    (problem,) = body_problems(body)
    assert (problem["type"], problem["loc"]) == (kind, loc)
    json.dumps(problem)  # renderable as it is


def test_the_json_gate_takes_nesting_to_its_depth_and_plain_json() -> None:
    assert body_problems(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) == []
    deeper = body_problems(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))
    assert [p["type"] for p in deeper] == ["too_deep"]
    assert body_problems(b'{"a": [1, 2.5e10, -3, "\\ud83d\\ude00", "\xc3\xa9", null]}') == []


@pytest.mark.parametrize(
    ("content_type", "taken"),
    [
        (None, True),
        ("application/json", True),
        ("Application/JSON; charset=utf-8", True),
        ("application/vnd.api+json", True),
        ("text/plain", False),
        ("application/x-www-form-urlencoded", False),
        ("multipart/form-data; boundary=x", False),
    ],
)
def test_the_json_gate_takes_only_bodies_declared_json(
    content_type: str | None, taken: bool
) -> None:
    assert (content_type_problem(content_type) is None) is taken


def test_the_json_gate_skims_long_base64_values_and_still_finds_what_is_around_them() -> None:
    long = "A" * 10_000
    assert body_problems(json.dumps({"files": {"a": long, "b": long}}).encode()) == []
    twice = '{"files": {"a": "' + long + '", "a": "' + long + '"}}'
    assert [p["loc"] for p in body_problems(twice.encode())] == [["body", "files", "a"]]
    two_long_keys = json.dumps({long: 1, long + "B": 2}).encode()
    assert body_problems(two_long_keys) == []  # long keys are read as they are, never merged
    after = '{"a": "' + long + '", "b": NaN}'
    assert [p["loc"] for p in body_problems(after.encode())] == [["body", "b"]]
