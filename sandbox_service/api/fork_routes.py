"""`POST /sessions/{session_id}/fork`: N new sessions, each a copy of one session's state."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from sandbox_service.api.context import ApiContext, context
from sandbox_service.api.dispatch import Unavailable
from sandbox_service.api.execute_routes import ERRORS
from sandbox_service.logs import request_id_var
from sandbox_service.tenancy import Tenant, scoped, tenant_var
from trainer_client.wire import ForkRequest, ForkResponse

router = APIRouter()
Context = Annotated[ApiContext, Depends(context)]
FORK_ID_PREFIX = "fork-"


def new_fork_id() -> str:
    """An unguessable id for a fork (the same shape whatever the parent's id)."""
    return FORK_ID_PREFIX + uuid.uuid4().hex


@router.post(
    "/sessions/{session_id}/fork",
    response_model=ForkResponse,
    responses={
        404: {"description": "No such session of this key (never created, ended, or expired)"},
        **{code: ERRORS[code] for code in (401, 422, 429, 503)},
    },
)
async def fork_session(
    session_id: Annotated[str, PathParam(min_length=1, max_length=256)],
    body: ForkRequest,
    ctx: Context,
) -> Response:
    """Make `n` new sessions whose interpreter state (variables, imports, files written in the
    session) is a copy of this session's after its cells admitted before the fork; each then
    lives, is limited and ends on its own. Forks belong to the caller's key."""
    bound = ctx.settings.max_fork_n
    if body.n > bound:
        message = f"n must be at most the server's max_fork_n ({bound})"
        raise RequestValidationError(
            [{"type": "less_than_equal", "loc": ("body", "n"), "msg": message, "input": body.n}]
        )
    tenant = tenant_var.get()  # the session and its forks are the caller's (as in to_payload)
    parent = scoped(tenant, session_id)
    forks = [_fork_id_beside(ctx, parent, tenant) for _ in range(body.n)]
    forked = await ctx.dispatcher.fork_session(
        parent, [scoped(tenant, fork) for fork in forks], request_id_var.get()
    )
    if forked is None:
        raise Unavailable("the fork did not run (queue deadline or lost worker); retry")
    if not forked:
        return JSONResponse({"detail": f"no session {session_id!r}"}, status_code=404)
    return JSONResponse(ForkResponse(session_ids=forks).model_dump())


def _fork_id_beside(ctx: ApiContext, parent: str, tenant: Tenant) -> str:
    """A fork id whose session lives in its parent's cell (drawn again until it does: about as
    many draws as cells)."""
    while True:
        fork = new_fork_id()
        if ctx.dispatcher.same_cell(parent, scoped(tenant, fork)):
            return fork
