"""A C++ request's job payload: its language and its tenant travel to the worker, its budget
covers the compile (pure)."""

from __future__ import annotations

from sandbox_service.api.context import to_payload
from sandbox_service.jobs import JobPayload
from sandbox_service.settings import Settings
from sandbox_service.tenancy import Tenant, tenant_var
from trainer_client.wire import ExecuteRequest

SETTINGS = Settings(compile_timeout_s=7.0)


def test_the_tenant_and_language_of_a_cpp_request_reach_the_worker() -> None:
    token = tenant_var.set(Tenant("alice"))
    try:
        payload = to_payload(ExecuteRequest(code="int main(){}", language="cpp", timeout=2))
    finally:
        tenant_var.reset(token)
    wire = payload.to_wire()
    assert (wire["lg"], wire["tn"]) == ("cpp", "alice")
    back = JobPayload.from_wire(wire)
    assert (back.language, back.tenant) == ("cpp", "alice")


def test_a_python_payload_carries_neither() -> None:
    wire = to_payload(ExecuteRequest(code="print(1)")).to_wire()
    assert "lg" not in wire and "tn" not in wire
    assert JobPayload.from_wire(wire).language == "python"


def test_a_cpp_jobs_budget_covers_its_compile() -> None:
    python = JobPayload(code="x", timeout_s=2.0)
    cpp = JobPayload(code="x", timeout_s=2.0, language="cpp")
    assert cpp.worker_budget_s(SETTINGS) == python.worker_budget_s(SETTINGS) + 7.0
    assert cpp.api_wait_s(SETTINGS) == python.api_wait_s(SETTINGS) + 7.0
