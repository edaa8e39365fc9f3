"""`POST /execute`, `POST /execute/batch`, `DELETE /sessions/{id}` and
`POST /groups/{group}/cancel`: the API's own routes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from sandbox_service.api.answers import answer
from sandbox_service.api.context import ApiContext, context, to_payload
from sandbox_service.api.validation import check_batch, check_request
from sandbox_service.logs import request_id_var
from sandbox_service.tenancy import scoped, tenant_var
from trainer_client.wire import (
    GROUP_PATTERN,
    BatchRequest,
    BatchResponse,
    ExecuteRequest,
    ExecuteResult,
    GroupCancelled,
)

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or unknown API key (when the server has keys)"},
    413: {"description": "Body larger than the server's max_body_bytes"},
    422: {"description": "Invalid request; `detail[].loc` names the field (and batch index)"},
    429: {
        "description": "Queue full, or the key's tenant over a quota (calls in flight, sessions, "
        "its share of the queue); nothing was run. Retry after `Retry-After` seconds"
    },
    503: {"description": "Redis unreachable, no worker, or shutting down; `detail` says which"},
}
BODY_MODELS: tuple[type[BaseModel], ...] = (ExecuteRequest, BatchRequest)
"""Request bodies these routes parse themselves (create_app adds them to the OpenAPI document)."""

router = APIRouter()
Context = Annotated[ApiContext, Depends(context)]


def parse_body[ModelT: BaseModel](model: type[ModelT], body: bytes) -> ModelT:
    """The request model parsed from raw JSON, or 422 errors located under `body`."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors) from None


# The execute endpoints read their body themselves: pydantic's JSON parser straight from bytes
# costs a fraction of FastAPI's body handling (json.loads, then validation of Python objects),
# and these are the hot path. So their request schemas are added to the OpenAPI document.
def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


@router.post(
    "/execute",
    response_model=ExecuteResult,
    responses=ERRORS,
    openapi_extra=_json_body(ExecuteRequest),
)
async def execute(http_request: Request) -> Response:
    """Run one program; its failure is a 200 with a status."""
    ctx: ApiContext = http_request.app.state.context
    request = parse_body(ExecuteRequest, await http_request.body())
    problems = check_request(request, ctx.settings, ("body",))
    if problems:
        raise RequestValidationError(problems)
    (result,) = await ctx.run([to_payload(request)], "/execute")
    return answer(result, ctx.answers)


@router.post(
    "/execute/batch",
    response_model=BatchResponse,
    responses=ERRORS,
    openapi_extra=_json_body(BatchRequest),
)
async def execute_batch(http_request: Request, ctx: Context) -> Response:
    """Run several programs in parallel across workers; results come back in request order."""
    batch = parse_body(BatchRequest, await http_request.body())
    problems = check_batch(batch, ctx.settings, tenant_var.get().max_in_flight)
    if problems:
        raise RequestValidationError(problems)
    results = await ctx.run([to_payload(r) for r in batch.requests], "/execute/batch")
    return answer({"results": results}, ctx.answers)


@router.delete(
    "/sessions/{session_id}",
    status_code=204,
    responses={
        404: {
            "description": "No such session of this key (never created, ended, expired, or "
            "another key's)"
        },
        **{code: ERRORS[code] for code in (401, 429, 503)},
    },
)
async def end_session(
    session_id: Annotated[str, PathParam(min_length=1, max_length=256)], ctx: Context
) -> Response:
    """End a session: its interpreter is freed and its recorded cells forgotten.

    Cells of the session admitted earlier run first. A later cell with the same id starts
    a new, empty session. Only the key's own sessions are found.
    """
    internal = scoped(tenant_var.get(), session_id)
    if not await ctx.dispatcher.end_session(internal, request_id_var.get()):
        return JSONResponse({"detail": f"no session {session_id!r}"}, status_code=404)
    await ctx.dispatcher.session_ended(internal)
    return Response(status_code=204)


@router.post(
    "/groups/{group:path}/cancel",
    response_model=GroupCancelled,
    responses={
        404: {"description": "No such group for this key (never used, or expired)"},
        **{code: ERRORS[code] for code in (401, 422, 429, 503)},
    },
)
async def cancel_group(
    group: Annotated[str, PathParam(pattern=GROUP_PATTERN)], ctx: Context
) -> Response:
    """Cancel every queued and running call of a group and end its sessions.

    Queued calls never run, running ones are killed within a second; each answers `cancelled`.
    A group is the caller's: for another key it does not exist (404).
    """
    done = await ctx.dispatcher.cancel_group(scoped(tenant_var.get(), group), request_id_var.get())
    if done is None:
        return JSONResponse({"detail": f"no group {group!r}"}, status_code=404)
    answer = GroupCancelled(group=group, cancelled=done.cancelled, sessions=done.sessions)
    return JSONResponse(answer.model_dump())
