"""Text a client sends that cannot be encoded (a lone surrogate, which JSON lets through) is
refused at the edge of every route, never carried to a worker or echoed into a 5xx."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from sandbox_service.api.compat.codejudge import Submission
from sandbox_service.api.compat.sandboxfusion import (
    InvalidRequest,
    RunCodeRequest,
    to_execute_request,
)
from sandbox_service.api.invalid import encodable
from sandbox_service.api.verify import VerifyRequest
from sandbox_service.settings import Settings
from trainer_client.wire import ExecuteRequest

LONE = "\udc80"


@pytest.mark.parametrize(
    "fields",
    [
        {"code": "print(1)" + LONE},
        {"code": "print(1)", "stdin": LONE},
        {"code": "print(1)", "fetch_files": ["out" + LONE]},
        {"code": "print(1)", "files": {"in" + LONE: ""}},
        {"code": "print(1)", "session_id": LONE},
    ],
)
def test_execute_request_refuses_unencodable_text(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ExecuteRequest.model_validate(fields)
    # The raw JSON route parses with pydantic's parser: the escape itself is refused there.
    with pytest.raises(ValidationError):
        ExecuteRequest.model_validate_json(json.dumps(fields))


@pytest.mark.parametrize("field", ["sub_id", "solution", "input", "expected_output"])
def test_code_judge_submission_refuses_unencodable_text(field: str) -> None:
    submission = {"type": "python", "solution": "print(1)", field: LONE}
    with pytest.raises(ValidationError):
        Submission.model_validate_json(json.dumps(submission))


@pytest.mark.parametrize(
    "fields",
    [{"code": LONE}, {"fetch_files": ["/tmp/a" + LONE]}, {"files": {"a" + LONE: ""}}],
)
def test_sandboxfusion_request_refuses_unencodable_text(fields: dict[str, object]) -> None:
    request = RunCodeRequest.model_validate({"code": "print(1)", "language": "python", **fields})
    with pytest.raises(InvalidRequest):
        to_execute_request(request, Settings())


@pytest.mark.parametrize("field", ["answer", "reference"])
def test_verify_item_refuses_unencodable_text(field: str) -> None:
    item = {"answer": "1", "reference": "1", field: LONE}
    with pytest.raises(ValidationError):
        VerifyRequest.model_validate({"items": [item]})


def test_validation_errors_are_rendered_encodable() -> None:
    errors = [{"loc": ["body", "files", "a" + LONE], "input": {"a" + LONE: "x"}, "msg": "bad é"}]
    rendered = encodable(errors)
    json.dumps(rendered, ensure_ascii=False).encode("utf-8")  # raises if anything is left
    assert rendered == [
        {"loc": ["body", "files", "a\\udc80"], "input": {"a\\udc80": "x"}, "msg": "bad é"}
    ]
