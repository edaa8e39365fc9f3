"""HTTP routes of the drop-in wire formats: code-judge (`/run*`, `/judge*`, `/status`) and
SandboxFusion (`/run_code`, `/run_jupyter`).

They run through the same path as `/execute` (api.create_app hands its runner in): the wire
mapping is in compat_codejudge and compat_sandboxfusion. The service's own refusals are answered
in each peer's style instead of our 429/503, so that its clients react as they were written to:

    refusal                 code-judge (HTTP 200)         SandboxFusion (HTTP 200)
    queue full (our 429)    reason `queue_timeout`        status `SandboxError` + Retry-After
    Redis down, draining    reason `internal_error`       status `SandboxError`

rStar2-Agent's client resubmits exactly the `queue_timeout` items; verl scores SandboxError -1.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from redis.exceptions import RedisError

from sandbox_service.api.answers import AnswerLedger, answer
from sandbox_service.api.compat.codejudge import (
    BatchJudgeResult,
    BatchSubmission,
    BatchSubmissionResult,
    JudgeResult,
    Planned,
    Reason,
    ServerStatus,
    Submission,
    SubmissionResult,
    not_run,
    plan,
    sub_id_of,
    to_submission_result,
)
from sandbox_service.api.compat.sandboxfusion import (
    CellRunResult,
    InvalidRequest,
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
    Unsupported,
    cell_request,
    cell_timeout_s,
    check_jupyter_request,
    jupyter_failure,
    jupyter_out_of_time,
    jupyter_session_id,
    jupyter_success,
    sandbox_error,
    to_cell_result,
    to_execute_request,
    to_run_code_response,
)
from sandbox_service.api.dispatch import Overloaded, Unavailable
from sandbox_service.api.metrics import Metrics
from sandbox_service.jobs import ResultDict
from sandbox_service.settings import Settings
from sandbox_service.tenancy import scoped, tenant_var
from trainer_client.wire import MIN_TIMEOUT_S, ExecuteRequest, ExecuteResult

RunRequests = Callable[[list[ExecuteRequest], str], Awaitable[list[ResultDict]]]
"""The API's execution path: admit the requests whole or not at all, await their results."""


class ServiceState(Protocol):
    """What the compat routes read of the service besides running requests (the Dispatcher)."""

    async def queue_depth(self) -> int: ...

    async def live_workers(self) -> int: ...

    async def end_session(self, session_id: str, request_id: str = "") -> bool: ...

    async def session_ended(self, session_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Refusal:
    """The service did not take the requests; nothing of them ran."""

    kind: Literal["queue_full", "unavailable"]
    message: str
    waited_s: float


async def run_or_refuse(
    run: RunRequests, requests: list[ExecuteRequest], route: str, metrics: Metrics
) -> list[ExecuteResult] | Refusal:
    """The results of the requests, or why the service refused them all."""
    started = time.monotonic()
    try:
        results = await run(requests, route)
    except Overloaded as exc:
        kind: Literal["queue_full", "unavailable"] = "queue_full"
        message, reason = str(exc), exc.reason
    except Unavailable as exc:
        kind, message = "unavailable", str(exc)
        reason = kind
    else:
        return [ExecuteResult.model_validate(result) for result in results]
    metrics.reject(reason, tenant_var.get().name)
    return Refusal(kind, message, time.monotonic() - started)


def codejudge_router(
    settings: Settings, run: RunRequests, metrics: Metrics, state: ServiceState
) -> APIRouter:
    """`POST /run*` and `/judge*`, `GET /status`, in code-judge's wire format."""
    router = APIRouter(tags=["code-judge compatibility"])

    async def run_chunk(chunk: Sequence[Planned], route: str) -> list[SubmissionResult]:
        outcome = await run_or_refuse(run, [p.request for p in chunk], route, metrics)
        if isinstance(outcome, Refusal):
            reason: Reason = "queue_timeout" if outcome.kind == "queue_full" else "internal_error"
            return [not_run(p.sub_id, reason, outcome.waited_s) for p in chunk]
        return [to_submission_result(p, r) for p, r in zip(chunk, outcome, strict=True)]

    async def judge(submissions: Sequence[Submission], route: str) -> list[SubmissionResult]:
        # code-judge takes batches of any length: past max_batch, chunks are admitted one by one,
        # and a chunk refused for a full queue comes back `queue_timeout`, to be resubmitted.
        # Past max_submissions (tens of thousands) the batch is refused whole with a 422.
        if len(submissions) > settings.max_submissions:
            message = f"{len(submissions)} submissions; at most {settings.max_submissions}"
            problem = {"type": "too_long", "loc": ["body", "submissions"], "msg": message}
            raise RequestValidationError([{**problem, "input": None}])
        plans = [plan(submission, settings) for submission in submissions]
        runnable = [p for p in plans if isinstance(p, Planned)]
        size = settings.max_batch
        chunks = [runnable[i : i + size] for i in range(0, len(runnable), size)]
        chunk_results = await asyncio.gather(*(run_chunk(chunk, route) for chunk in chunks))
        done = iter([result for results in chunk_results for result in results])
        return [next(done) if isinstance(p, Planned) else p for p in plans]

    @router.post("/run", response_model=SubmissionResult)
    async def run_one(submission: Submission) -> Response:
        """Run one submission (code-judge's `/run`)."""
        (result,) = await judge([submission], "/run")
        return _json(result)

    @router.post("/run/batch", response_model=BatchSubmissionResult)
    async def run_batch(batch: BatchSubmission) -> Response:
        """Run submissions in parallel; results in submission order (code-judge's `/run/batch`)."""
        results = await judge(batch.submissions, "/run/batch")
        return _json(BatchSubmissionResult(sub_id=sub_id_of(batch.sub_id), results=results))

    @router.post("/run/long-batch", response_model=BatchSubmissionResult)
    async def run_long_batch(batch: BatchSubmission) -> Response:
        """`/run/batch` for large batches (code-judge's `/run/long-batch`, rStar2-Agent's call)."""
        results = await judge(batch.submissions, "/run/long-batch")
        return _json(BatchSubmissionResult(sub_id=sub_id_of(batch.sub_id), results=results))

    @router.post("/judge", response_model=JudgeResult)
    async def judge_one(submission: Submission) -> Response:
        """`/run` without the program's output (code-judge's `/judge`)."""
        (result,) = await judge([submission], "/judge")
        return _json(JudgeResult.of(result))

    async def judge_batch(batch: BatchSubmission, route: str) -> Response:
        results = await judge(batch.submissions, route)
        judged = [JudgeResult.of(result) for result in results]
        return _json(BatchJudgeResult(sub_id=sub_id_of(batch.sub_id), results=judged))

    @router.post("/judge/batch", response_model=BatchJudgeResult)
    async def judge_batch_route(batch: BatchSubmission) -> Response:
        """`/run/batch` without the programs' output (code-judge's `/judge/batch`)."""
        return await judge_batch(batch, "/judge/batch")

    @router.post("/judge/long-batch", response_model=BatchJudgeResult)
    async def judge_long_batch_route(batch: BatchSubmission) -> Response:
        """`/run/long-batch` without the programs' output (code-judge's `/judge/long-batch`)."""
        return await judge_batch(batch, "/judge/long-batch")

    @router.get("/status", response_model=ServerStatus)
    async def status() -> Response:
        """Jobs waiting and workers alive (code-judge's `/status`, read by its JudgeClient)."""
        try:
            queue, workers = await state.queue_depth(), await state.live_workers()
        except (RedisError, OSError) as exc:
            return JSONResponse({"detail": f"redis unreachable: {exc}"}, status_code=503)
        return _json(ServerStatus(queue=queue, num_workers=workers))

    return router


def sandboxfusion_router(
    settings: Settings,
    run: RunRequests,
    metrics: Metrics,
    state: ServiceState,
    answers: AnswerLedger,
) -> APIRouter:
    """`POST /run_code` and `/run_jupyter` in SandboxFusion's wire format; their answers carry
    fetched files, so they are sent as the client reads them (api/answers.py)."""
    router = APIRouter(tags=["SandboxFusion compatibility"])

    async def refused(outcome: Refusal) -> Response:
        if outcome.kind == "unavailable":
            return _json(sandbox_error(outcome.message))
        retry = f"nothing ran; retry after {settings.retry_after_s} s"
        return _json(
            sandbox_error(f"{outcome.message}; {retry}"),
            headers={"Retry-After": str(settings.retry_after_s)},
        )

    @router.post("/run_code", response_model=RunCodeResponse)
    async def run_code(body: RunCodeRequest) -> Response:
        """Run one program (SandboxFusion's `/run_code`); only `python` runs here."""
        try:
            request = to_execute_request(body, settings)
        except Unsupported as exc:
            return _json(sandbox_error(str(exc)))
        except InvalidRequest as exc:
            raise RequestValidationError(exc.problems) from None
        outcome = await run_or_refuse(run, [request], "/run_code", metrics)
        if isinstance(outcome, Refusal):
            return await refused(outcome)
        return answer(to_run_code_response(outcome[0]).model_dump(mode="json"), answers)

    @router.post("/run_jupyter", response_model=RunJupyterResponse)
    async def run_jupyter(body: RunJupyterRequest) -> Response:
        """Run cells in order in one interpreter (SandboxFusion's `/run_jupyter`), as cells of a
        session of their own that ends with the request."""
        try:
            check_jupyter_request(body, settings)
        except InvalidRequest as exc:
            raise RequestValidationError(exc.problems) from None
        session_id = jupyter_session_id()
        started = time.monotonic()
        cells: list[CellRunResult] = []
        files: dict[str, str] = {}
        try:
            for index in range(len(body.cells)):
                elapsed = time.monotonic() - started
                timeout_s = cell_timeout_s(body, elapsed, settings)
                if timeout_s < MIN_TIMEOUT_S:
                    return _json(jupyter_out_of_time(elapsed))
                request = cell_request(body, index, timeout_s, session_id, settings)
                outcome = await run_or_refuse(run, [request], "/run_jupyter", metrics)
                if isinstance(outcome, Refusal):
                    return await refused(outcome)
                (result,) = outcome
                cell = to_cell_result(result)
                if cell is None:
                    return _json(jupyter_failure(result, index, time.monotonic() - started))
                cells.append(cell)
                files = result.files
        finally:
            # Also when the client went away mid-request: the session must not outlive it.
            await asyncio.shield(_end_quietly(state, session_id))
        success = jupyter_success(cells, files, time.monotonic() - started)
        return answer(success.model_dump(mode="json"), answers)

    return router


async def _end_quietly(state: ServiceState, session_id: str) -> None:
    internal = scoped(tenant_var.get(), session_id)  # the cells' session (context.to_payload)
    with contextlib.suppress(Overloaded, Unavailable, RedisError, OSError):
        await state.end_session(internal)
        await state.session_ended(internal)


def _json(model: BaseModel, headers: dict[str, str] | None = None) -> Response:
    return Response(model.model_dump_json(), media_type="application/json", headers=headers)
