"""`GET /healthz`, `/readyz` and `/metrics`: open even with an API key (probes and scrapers)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from redis.exceptions import RedisError

from sandbox_service.api.context import ApiContext, context

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
    """Prometheus text format: this process's metrics and the live workers' (label `worker`)."""
    m, dispatcher = ctx.metrics, ctx.dispatcher
    m.in_flight.set(dispatcher.in_flight)
    m.scraped.lost_job_retries = dispatcher.retries
    try:
        m.queued_jobs.set(await dispatcher.queue_depth())
        m.workers_alive.set(await dispatcher.live_workers())
        m.scraped.workers = await dispatcher.worker_stats()
        m.redis_up.set(1)
    except (RedisError, OSError):
        m.redis_up.set(0)
        m.scraped.workers = {}
    return Response(m.render(), media_type=CONTENT_TYPE_LATEST)
