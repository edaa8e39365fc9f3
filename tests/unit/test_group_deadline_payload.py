"""The group and deadline of a call as they travel (pure): through the job payload's wire form,
into the program's limit, the retry's start-by time, and the request model's bounds."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from sandbox_service.cancel import GROUP_CANCELLED, never_ran
from sandbox_service.execution import Limits
from sandbox_service.jobs import JobPayload
from sandbox_service.worker.main import within_deadline
from trainer_client.wire import ExecuteRequest


def test_group_and_deadline_survive_the_wire_and_are_absent_when_unset() -> None:
    payload = JobPayload(code="1", group="alice/step-3:p/7", deadline=1000.5)
    assert JobPayload.from_wire(payload.to_wire()) == payload
    plain = JobPayload(code="1")
    assert "g" not in plain.to_wire() and "dl" not in plain.to_wire()
    assert JobPayload.from_wire(plain.to_wire()) == plain


def test_a_deadline_cuts_the_program_limit_only_when_it_comes_first() -> None:
    job = JobPayload(code="1", timeout_s=10.0, deadline=100.0)
    assert within_deadline(job, 50.0) == (job, False)  # 50 s left, 10 s limit
    cut, was_cut = within_deadline(job, 97.5)
    assert was_cut and cut.timeout_s == pytest.approx(2.5)
    assert within_deadline(JobPayload(code="1"), 1e12)[1] is False  # no deadline
    assert job.past_deadline(100.0) and not job.past_deadline(99.9)
    assert not JobPayload(code="1").past_deadline(1e12)


def test_a_retry_never_gets_a_start_by_past_the_deadline() -> None:
    job = JobPayload(code="1", deadline=105.0, start_by=50.0)
    assert job.retried(100.0, 30.0).start_by == 105.0
    assert JobPayload(code="1").retried(100.0, 30.0).start_by == 130.0


@pytest.mark.parametrize("deadline_s", [0, -1, math.inf, math.nan, 86400.5])
def test_a_deadline_is_finite_positive_and_at_most_a_day(deadline_s: float) -> None:
    with pytest.raises(ValidationError, match="deadline_s"):
        ExecuteRequest(code="1", deadline_s=deadline_s)
    assert ExecuteRequest(code="1", deadline_s=86400).deadline_s == 86400


@pytest.mark.parametrize("group", ["", "a b", "x" * 129, "é", "a\nb", "a?b"])
def test_a_group_label_is_1_to_128_of_the_documented_characters(group: str) -> None:
    with pytest.raises(ValidationError, match="group"):
        ExecuteRequest(code="1", group=group)
    assert ExecuteRequest(code="1", group="A-z_0.9:/" + "x" * 119).group is not None


def test_a_cancelled_job_that_never_ran_says_why() -> None:
    assert "its group was cancelled" in never_ran(GROUP_CANCELLED)
    assert "never ran" in never_ran("anything else")


def test_a_service_written_job_carries_its_own_output_cap_and_a_client_job_the_hosts() -> None:
    host = Limits(max_output_bytes=64)
    verifier = JobPayload.from_wire(JobPayload(code="x", output_bytes=10240).to_wire())
    assert verifier.to_spec("a", host).limits.max_output_bytes == 10240
    assert JobPayload(code="x").to_spec("b", host).limits.max_output_bytes == 64


@pytest.mark.parametrize("seed", ["true", "1.0", '"1"', "-1", "4294967296"])
def test_a_seed_is_an_integer_in_range_and_nothing_else(seed: str) -> None:
    with pytest.raises(ValidationError):
        ExecuteRequest.model_validate_json('{"code": "x", "seed": ' + seed + "}")
    assert ExecuteRequest.model_validate_json('{"code": "x", "seed": 4294967295}').seed == 2**32 - 1
