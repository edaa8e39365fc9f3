"""The HTTP API (../shared/spec/API.md): FastAPI app built from one Settings object.

A request is validated (wire model, then the server's limits), converted to a JobPayload,
admitted and awaited by the Dispatcher. A program's failure is a 200 with its status; only the
service's own failures are HTTP errors (422/413 input, 401 key, 429 overload, 503 unavailable).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from redis.exceptions import RedisError

from sandbox_service import __version__
from sandbox_service.api.compat.routes import codejudge_router, sandboxfusion_router
from sandbox_service.api.dispatch import Dispatcher, Overloaded, Unavailable
from sandbox_service.api.edge import Edge
from sandbox_service.api.metrics import Metrics
from sandbox_service.api.validation import check_batch, check_request
from sandbox_service.api.verify import verify_router
from sandbox_service.jobs import JobPayload, ResultDict
from sandbox_service.logs import request_id_var
from sandbox_service.models import BatchRequest, BatchResponse, ExecuteRequest, ExecuteResult
from sandbox_service.settings import Settings

log = logging.getLogger(__name__)

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or wrong API key (when the server has one)"},
    413: {"description": "Body larger than the server's max_body_bytes"},
    422: {"description": "Invalid request; `detail[].loc` names the field (and batch index)"},
    429: {"description": "Queue full; nothing was run. Retry after `Retry-After` seconds"},
    503: {"description": "Redis unreachable, no worker, or shutting down; `detail` says which"},
}


def to_payload(request: ExecuteRequest) -> JobPayload:
    """The job payload of one validated request (the dispatcher stamps queue fields)."""
    return JobPayload(
        code=request.code,
        stdin=request.stdin,
        timeout_s=request.timeout,
        memory_mb=request.memory_mb,
        files=dict(request.files),
        fetch_files=tuple(request.fetch_files),
        session_id=request.session_id,
        request_id=request_id_var.get(),
    )


def create_app(settings: Settings) -> FastAPI:
    """The API app; its lifespan starts and stops the dispatcher."""
    metrics = Metrics()
    dispatcher = Dispatcher(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await dispatcher.start()
        log.info("api ready", extra={"fields": {"api_id": dispatcher.api_id}})
        try:
            yield
        finally:
            await dispatcher.stop()

    app = FastAPI(
        title="rl-sandbox",
        version=__version__,
        description="Jailed Python execution for agentic RL tool calls.",
        lifespan=lifespan,
    )
    app.state.dispatcher = dispatcher
    app.state.metrics = metrics
    app.add_middleware(
        Edge,
        api_key=settings.api_key,
        max_body_bytes=settings.max_body_bytes,
        on_response=lambda route, code: metrics.http_responses.labels(route, str(code)).inc(),
    )

    @app.exception_handler(Overloaded)
    async def overloaded(request: Request, exc: Overloaded) -> Response:
        metrics.rejected.labels("queue_full").inc()
        return JSONResponse(
            {"detail": str(exc)},
            status_code=429,
            headers={"Retry-After": str(settings.retry_after_s)},
        )

    @app.exception_handler(Unavailable)
    async def unavailable(request: Request, exc: Unavailable) -> Response:
        metrics.rejected.labels("unavailable").inc()
        return JSONResponse({"detail": str(exc)}, status_code=503)

    async def run(payloads: list[JobPayload], route: str) -> list[ResultDict]:
        started = time.perf_counter()
        results = await dispatcher.submit(payloads)
        for result in results:
            metrics.observe_result(result)
        metrics.request_time.labels(route).observe(time.perf_counter() - started)
        return results

    @app.post(
        "/execute",
        response_model=ExecuteResult,
        responses=_ERRORS,
        openapi_extra=_json_body(ExecuteRequest),
    )
    async def execute(http_request: Request) -> Response:
        """Run one program; its failure is a 200 with a status."""
        request = parse_body(ExecuteRequest, await http_request.body())
        problems = check_request(request, settings, ("body",))
        if problems:
            raise RequestValidationError(problems)
        (result,) = await run([to_payload(request)], "/execute")
        return Response(json.dumps(result), media_type="application/json")

    @app.post(
        "/execute/batch",
        response_model=BatchResponse,
        responses=_ERRORS,
        openapi_extra=_json_body(BatchRequest),
    )
    async def execute_batch(http_request: Request) -> Response:
        """Run several programs in parallel across workers; results come back in request order."""
        batch = parse_body(BatchRequest, await http_request.body())
        problems = check_batch(batch, settings)
        if problems:
            raise RequestValidationError(problems)
        results = await run([to_payload(r) for r in batch.requests], "/execute/batch")
        return Response(json.dumps({"results": results}), media_type="application/json")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: 200 while the process serves."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"description": "Not ready; `detail` says why"}})
    async def readyz() -> Response:
        """Readiness: 200 only when Redis answers and at least one worker is alive."""
        ready, reason = await dispatcher.readiness()
        return JSONResponse(
            {"status": "ready" if ready else "unavailable", "detail": reason},
            status_code=200 if ready else 503,
        )

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics_endpoint() -> Response:
        """Prometheus text format."""
        metrics.in_flight.set(dispatcher.in_flight)
        metrics.lost_job_retries.set(dispatcher.retries)
        try:
            metrics.queue_depth.set(await dispatcher.queue_depth())
            metrics.workers_alive.set(await dispatcher.live_workers())
            metrics.redis_up.set(1)
        except (RedisError, OSError):
            metrics.redis_up.set(0)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.delete(
        "/sessions/{session_id}",
        status_code=204,
        responses={
            404: {"description": "No such session (never created, ended, or expired)"},
            **{code: _ERRORS[code] for code in (401, 429, 503)},
        },
    )
    async def end_session(
        session_id: Annotated[str, PathParam(min_length=1, max_length=256)],
    ) -> Response:
        """End a session: its interpreter is freed and its recorded cells forgotten.

        Cells of the session admitted earlier run first. A later cell with the same id starts
        a new, empty session.
        """
        if not await dispatcher.end_session(session_id, request_id_var.get()):
            return JSONResponse({"detail": f"no session {session_id!r}"}, status_code=404)
        return Response(status_code=204)

    async def run_requests(requests: list[ExecuteRequest], route: str) -> list[ResultDict]:
        return await run([to_payload(request) for request in requests], route)

    app.include_router(codejudge_router(settings, run_requests, metrics, dispatcher))
    app.include_router(sandboxfusion_router(settings, run_requests, metrics, dispatcher))
    app.include_router(verify_router(settings, run))
    _document_bodies(app, (ExecuteRequest, BatchRequest))
    return app


def parse_body[ModelT: BaseModel](model: type[ModelT], body: bytes) -> ModelT:
    """The request model parsed from raw JSON, or 422 errors located under `body`."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


# The execute endpoints read their body themselves: pydantic's JSON parser straight from bytes
# costs a fraction of FastAPI's body handling (json.loads, then validation of Python objects),
# and these are the hot path. So their request schemas are added to the OpenAPI document here.
def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _document_bodies(app: FastAPI, models: tuple[type[BaseModel], ...]) -> None:
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
