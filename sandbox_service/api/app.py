"""The HTTP API (../shared/spec/API.md): FastAPI app built from one Settings object.

create_app is wiring only: the context (settings, dispatcher, metrics), the edge middleware,
the error handlers and the routers (execute_routes, operations, verify, the compat routes).
A request is validated (wire model, then the server's limits), converted to a JobPayload,
admitted and awaited by the Dispatcher. A program's failure is a 200 with its status; only the
service's own failures are HTTP errors (422/413 input, 401 key, 429 overload, 503 unavailable).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from sandbox_service import __version__
from sandbox_service.api import execute_routes, fork_routes, operations
from sandbox_service.api.answers import AnswerLedger
from sandbox_service.api.call_labels import read_call_labels
from sandbox_service.api.cells import Cells
from sandbox_service.api.compat.e2b_routes import E2bWire
from sandbox_service.api.compat.mcp_routes import McpMount
from sandbox_service.api.compat.nemo_routes import NemoWire
from sandbox_service.api.compat.routes import codejudge_router, sandboxfusion_router
from sandbox_service.api.compat.wires import PeerWires
from sandbox_service.api.context import ApiContext
from sandbox_service.api.dispatch import Dispatcher, Overloaded, OverRecorded, Unavailable
from sandbox_service.api.docs_ui import serve_docs
from sandbox_service.api.edge import Edge
from sandbox_service.api.grade import grade_router
from sandbox_service.api.invalid import invalid_request
from sandbox_service.api.json_gate import JsonGate
from sandbox_service.api.metrics import Metrics
from sandbox_service.api.verify import verify_router
from sandbox_service.settings import Settings
from sandbox_service.tenancy import tenant_var

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> FastAPI:
    """The API app; its lifespan starts and stops the dispatcher."""
    several = len(settings.cell_urls()) > 1
    dispatcher = Cells(settings) if several else Dispatcher(settings)
    largest_answer = settings.max_fetch_bytes * 4 // 3 + 2 * settings.max_output_bytes
    weights = {t.name: t.weight for t in settings.tenants()}
    answers = AnswerLedger(settings.max_unread_answer_bytes, largest_answer, weights)
    ctx = ApiContext(settings, dispatcher, Metrics(), answers)
    mcp = McpMount(ctx)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await ctx.dispatcher.start()
        log.info("api ready", extra={"fields": {"api_id": ctx.dispatcher.api_id}})
        try:
            async with mcp.running():
                yield
        finally:
            await ctx.dispatcher.stop()

    app = FastAPI(
        title="rl-sandbox",
        version=__version__,
        description="Jailed Python execution for agentic RL tool calls.",
        lifespan=lifespan,
        docs_url=None,  # served by docs_ui, with its assets from this process
        redoc_url=None,
    )
    app.state.context = ctx
    # Inside the Edge: the E2B, MCP and NeMo-Skills wires, dispatched before FastAPI's routes.
    app.add_middleware(PeerWires, e2b=E2bWire(ctx), nemo=NemoWire(ctx), mcp=mcp.app)
    # Between the Edge and every route: one parse of each body, by one set of rules (json_gate).
    app.add_middleware(JsonGate)
    app.add_middleware(
        Edge,
        credentials=settings.credentials(),
        max_body_bytes=settings.max_body_bytes,
        on_response=ctx.metrics.respond,
        operator_key=None if settings.operator_key is None else settings.operator_key.encode(),
    )
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(Overloaded, _overloaded)
    app.add_exception_handler(Unavailable, _unavailable)
    # Routes are matched in this order, each failed match costing a few microseconds: the
    # execution routes first, the operational ones (probes, scrapes) last.
    app.include_router(execute_routes.router)
    app.include_router(fork_routes.router)
    labels = [Depends(read_call_labels)]
    app.include_router(
        codejudge_router(settings, ctx.run_requests, ctx.metrics, ctx.dispatcher),
        dependencies=labels,
    )
    app.include_router(
        sandboxfusion_router(settings, ctx.run_requests, ctx.metrics, ctx.dispatcher, ctx.answers),
        dependencies=labels,
    )
    app.include_router(verify_router(settings, ctx.run))
    app.include_router(grade_router(settings, ctx.run))
    app.include_router(operations.router)
    serve_docs(app)
    _document_bodies(app, execute_routes.BODY_MODELS)
    return app


async def _overloaded(request: Request, exc: Exception) -> Response:
    ctx: ApiContext = request.app.state.context
    reason = exc.reason if isinstance(exc, Overloaded) else "queue_full"
    ctx.metrics.reject(reason, tenant_var.get().name)
    if isinstance(exc, OverRecorded) and exc.status_code == 422:
        return JSONResponse({"detail": str(exc)}, status_code=422)
    return JSONResponse(
        {"detail": str(exc)},
        status_code=429,
        headers={"Retry-After": str(ctx.settings.retry_after_s)},
    )


async def _unavailable(request: Request, exc: Exception) -> Response:
    ctx: ApiContext = request.app.state.context
    ctx.metrics.reject("unavailable", tenant_var.get().name)
    return JSONResponse({"detail": str(exc)}, status_code=503)


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
