"""Schemathesis over the real API's OpenAPI document: requests generated from every operation's
schema (valid ones and near misses) never get a server error. Bounded: a few examples per
operation against the shared stack; `st run` does the long version (docs/api.md, "Input
bounds").

Schemathesis' own pytest plugin does not load under this pytest, so each operation's strategy
drives a hypothesis test here."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tests.service.stack import Stack

schemathesis = pytest.importorskip("schemathesis")  # the dev extra; `make setup` installs it
from schemathesis.checks import not_a_server_error  # noqa: E402

EXAMPLES_PER_OPERATION = 8


def test_no_generated_request_is_a_server_error(stack: Stack) -> None:
    schema = schemathesis.openapi.from_url(f"{stack.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 16, [op.label for op in operations]
    failures: dict[str, str] = {}
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def no_server_error(case: Any) -> None:
            response = case.call(timeout=90)
            case.validate_response(response, checks=(not_a_server_error,))

        try:
            no_server_error()
        except Exception as exc:  # every operation is tried; all failures are reported
            failures[operation.label] = str(exc)[:2000]
    assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
