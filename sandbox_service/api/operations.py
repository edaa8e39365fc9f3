"""`GET /healthz`, `/readyz` and `/metrics`: open even with an API key (probes and scrapers);
`GET /metrics/tenants`: the per-tenant series, to a key."""

from __future__ import annotations

import contextlib
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from redis.exceptions import RedisError

from sandbox_service.api.context import ApiContext, context
from sandbox_service.api.edge import OPERATOR, TENANT_METRICS_PATH
from sandbox_service.tenancy import tenant_var

router = APIRouter(tags=["operations"])
Context = Annotated[ApiContext, Depends(context)]


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: 200 while the process serves."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "Not ready; `detail` says why"}})
async def readyz(ctx: Context) -> Response:
    """Readiness: 200 only when Redis answers and at least one worker is alive."""
    ready, reason = await ctx.dispatcher.readiness()
    return JSONResponse(
        {"status": "ready" if ready else "unavailable", "detail": reason},
        status_code=200 if ready else 503,
    )


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(ctx: Context) -> Response:
    """Prometheus text format: this process's metrics and the live workers' (label `worker`);
    aggregates only, no tenant's name or figure (those are `/metrics/tenants`')."""
    m, dispatcher = ctx.metrics, ctx.dispatcher
    m.in_flight.set(dispatcher.in_flight)
    m.scraped.lost_job_retries = dispatcher.retries
    try:
        m.queued_jobs.set(await dispatcher.queue_depth())
        m.workers_alive.set(await dispatcher.live_workers())
        m.scraped.workers = await dispatcher.worker_stats()
        m.scraped.recorded_bytes = sum((await dispatcher.recorded_bytes()).values())
        m.redis_up.set(1)
    except (RedisError, OSError):
        m.redis_up.set(0)
        m.scraped.workers = {}
        m.scraped.recorded_bytes = 0
    return Response(m.render(), media_type=CONTENT_TYPE_LATEST)


@router.get(
    TENANT_METRICS_PATH,
    response_class=PlainTextResponse,
    responses={401: {"description": "Missing or unknown key (when the server has keys)"}},
)
async def tenant_metrics(request: Request, ctx: Context) -> Response:
    """Prometheus text format: the per-tenant series of this process (label `tenant`), the key's
    own tenant's only; the operator key (setting `operator_key`) gets every tenant's."""
    operator = bool(request.scope.get("state", {}).get(OPERATOR))
    with contextlib.suppress(RedisError, OSError):
        ctx.metrics.tenants.set_recorded_bytes(await ctx.dispatcher.recorded_bytes())
    text = ctx.metrics.tenants.render(None if operator else tenant_var.get().name)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
