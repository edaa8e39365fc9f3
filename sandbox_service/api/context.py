"""What every route of the API process works with: the settings, the dispatcher and the metrics,
built once by create_app and reached from a request through `app.state`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fastapi import Request

from sandbox_service.api.answers import AnswerLedger
from sandbox_service.api.call_labels import labelled
from sandbox_service.api.cells import Cells
from sandbox_service.api.dispatch import Dispatcher, Unavailable
from sandbox_service.api.metrics import Metrics
from sandbox_service.jobs import JobPayload, ResultDict
from sandbox_service.logs import request_id_var
from sandbox_service.settings import Settings
from sandbox_service.tenancy import scoped, tenant_var
from trainer_client.wire import ExecuteRequest


@dataclass(frozen=True, slots=True)
class ApiContext:
    """The API process's collaborators."""

    settings: Settings
    dispatcher: Dispatcher | Cells
    """One cell's Dispatcher, or Cells over several (api/cells.py)."""
    metrics: Metrics
    answers: AnswerLedger
    """The large answers this process is sending (api/answers.py)."""

    async def run(self, payloads: list[JobPayload], route: str) -> list[ResultDict]:
        """Admit, run and await the payloads; record their results and the route's time.
        Refused (Unavailable) before anything runs while the tenant's unread answers are over
        their bound."""
        over = self.answers.over(tenant_var.get().name)
        if over is not None:
            raise Unavailable(over)
        started = time.perf_counter()
        results = await self.dispatcher.submit(payloads)
        tenant = tenant_var.get().name
        for result in results:
            self.metrics.observe_result(result, tenant)
        self.metrics.request_duration.labels(route).observe(time.perf_counter() - started)
        return results

    async def run_requests(self, requests: list[ExecuteRequest], route: str) -> list[ResultDict]:
        """`run` of validated wire requests (the peer routes': their headers' group and
        deadline apply, see call_labels.py)."""
        return await self.run([to_payload(labelled(request)) for request in requests], route)


async def context(request: Request) -> ApiContext:
    """The context of the app serving `request` (a FastAPI dependency).

    A coroutine: FastAPI runs a plain function dependency in its thread pool, a thread hop per
    request (about 0.1 ms of the API's CPU per call here)."""
    found: ApiContext = request.app.state.context
    return found


def to_payload(request: ExecuteRequest) -> JobPayload:
    """The job payload of one validated request (the dispatcher stamps queue fields).

    The session and the group are the calling tenant's (another tenant's same id is another
    session or group); the relative deadline becomes an epoch here, once.
    """
    group = None if request.group is None else scoped(tenant_var.get(), request.group)
    deadline = 0.0 if request.deadline_s is None else time.time() + request.deadline_s
    session_id = request.session_id
    return JobPayload(
        code=request.code,
        stdin=request.stdin,
        timeout_s=request.timeout,
        memory_mb=request.memory_mb,
        files=dict(request.files),
        fetch_files=tuple(request.fetch_files),
        session_id=None if session_id is None else scoped(tenant_var.get(), session_id),
        request_id=request_id_var.get(),
        group=group,
        deadline=deadline,
        language=request.language,
        tenant=tenant_var.get().name,
        seed=request.seed,
    )
