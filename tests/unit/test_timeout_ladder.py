"""The timeout ladder: program limit < job timeout < API wait < the client's read timeout, for
plain calls and session cells, with the client's and the server's defaults."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from sandbox_service.jobs import JobPayload
from sandbox_service.settings import Settings
from trainer_client.dispatch import DispatchConfig
from trainer_client.http import Timeouts
from trainer_client.wire import ExecuteRequest

SETTINGS = Settings()


def test_client_defaults_match_the_server_defaults() -> None:
    assert Timeouts().response_margin_s == SETTINGS.client_response_margin_s
    assert DispatchConfig().server_max_timeout_s == SETTINGS.max_timeout


@given(
    timeout_s=st.floats(min_value=0.01, max_value=SETTINGS.max_timeout),
    kind=st.sampled_from(["program", "session", "cpp"]),
)
def test_the_client_outwaits_the_server_for_every_admissible_call(
    timeout_s: float, kind: str
) -> None:
    session_id = "s-1" if kind == "session" else None
    language = "cpp" if kind == "cpp" else "python"
    payload = JobPayload(code="x", timeout_s=timeout_s, session_id=session_id, language=language)
    request = ExecuteRequest(code="x", timeout=timeout_s, session_id=session_id, language=language)
    program_s = payload.budget_timeout_s(SETTINGS.max_timeout)
    job_s = payload.worker_budget_s(SETTINGS)
    api_s = payload.api_wait_s(SETTINGS)
    client_read_s = Timeouts().for_batch(DispatchConfig().budget_s(request)).read
    assert client_read_s is not None
    assert timeout_s <= program_s < job_s < api_s < client_read_s


def test_a_short_session_cell_gets_the_long_read_timeout() -> None:
    cell = ExecuteRequest(code="x", timeout=1.0, session_id="s")
    assert DispatchConfig().budget_s(cell) == SETTINGS.max_timeout
    assert DispatchConfig().budget_s(ExecuteRequest(code="x", timeout=1.0)) == 1.0


def test_a_queue_deadline_the_api_would_outwait_clients_by_is_refused() -> None:
    with pytest.raises(ValidationError, match="client_response_margin_s"):
        Settings(queue_deadline_s=200.0)
    with pytest.raises(ValidationError, match="a C\\+\\+ compile"):
        Settings(compile_timeout_s=100.0)
    assert Settings(queue_deadline_s=200.0, client_response_margin_s=300.0).queue_deadline_s == 200
