"""The MCP server of mcp_server.py inside the API process: its tools run on our dispatcher, and
its sessions are named in the tenant of the request (see wires.py, which passes it on)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from redis.exceptions import RedisError
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from sandbox_service.api.context import ApiContext
from sandbox_service.api.dispatch import Overloaded, Unavailable
from sandbox_service.jobs import JobPayload
from sandbox_service.logs import request_id_var
from sandbox_service.session_shares import share
from sandbox_service.tenancy import Tenant, configured, scoped, tenant_var
from trainer_client.wire import ExecuteResult

ROUTE = "/mcp"
_SSE_SESSION = re.compile(rb"session_id=([0-9a-f]{8,128})")
"""The SSE transport's session id, in the first event it sends (the endpoint to post to)."""
MEMORY_MB = 1024
RETRY_AFTER_S = 30
"""Retry-After of a tenant's new MCP session past its share (sessions close at their DELETE)."""


class McpMount:
    """The `/mcp` ASGI app and the lifespan of its session manager; None parts without `mcp`."""

    def __init__(self, ctx: ApiContext) -> None:
        try:
            from sandbox_service.api.compat import mcp_server
        except ImportError:  # an install without the MCP SDK (a base dependency): no /mcp
            self.app: Any = None
            self._server: Any = None
            return

        tenants = {t.name: t for t in ctx.settings.tenants()}

        async def run(
            code: str, session: str | None, timeout_s: float, tenant: str
        ) -> ExecuteResult:
            # The tool runs in the MCP server's own task: admit it as the request's tenant (its
            # queue, share and quotas), which the edge bound only in the request's task.
            token = tenant_var.set(configured(tenants, tenant))
            try:
                return await run_as_tenant(code, session, timeout_s, tenant)
            finally:
                tenant_var.reset(token)

        async def run_as_tenant(
            code: str, session: str | None, timeout_s: float, tenant: str
        ) -> ExecuteResult:
            payload = JobPayload(
                code=code,
                timeout_s=timeout_s,
                memory_mb=min(MEMORY_MB, ctx.settings.max_memory_mb),
                session_id=scoped(Tenant(tenant), session) if session else None,
                request_id=request_id_var.get(),
            )
            (result,) = await ctx.run([payload], ROUTE)
            return ExecuteResult.model_validate(result)

        async def end(mcp_session: str, tenant: str) -> None:
            session = scoped(Tenant(tenant), mcp_server.session_name(mcp_session))
            with contextlib.suppress(Overloaded, Unavailable, RedisError, OSError):
                await ctx.dispatcher.end_session(session, request_id_var.get())

        self._server = mcp_server.build_server(run, ctx.settings.max_timeout)
        self._ending: set[asyncio.Task[None]] = set()
        max_sessions = ctx.settings.max_mcp_sessions
        streamable = mcp_server.http_app(self._server, max_sessions)
        weights = {t.name: t.weight for t in tenants.values()} if len(tenants) > 1 else {}

        def over_share(tenant: str) -> str | None:
            """Why `tenant` may not open another streamable-HTTP session now, or None."""
            allowed = share(max_sessions, weights, tenant) if weights else max_sessions
            held = mcp_server.open_sessions(self._server, tenant)
            if held < allowed:
                return None
            return (
                f"this tenant holds {held} open MCP sessions, its share of max_mcp_sessions "
                f"({max_sessions}) is {allowed}: end one (DELETE /mcp with its mcp-session-id) "
                "or wait for an idle one to close"
            )

        sse = mcp_server.sse_app(self._server)

        def tenant_of(scope: Scope) -> str:
            """The request's tenant, as wires.py passes it on."""
            headers: dict[bytes, bytes] = dict(scope["headers"])
            return headers.get(mcp_server.TENANT_HEADER.encode(), b"default").decode()

        def end_later(mcp_session: str, scope: Scope) -> None:
            task = asyncio.create_task(end(mcp_session, tenant_of(scope)), name="mcp-session-end")
            self._ending.add(task)
            task.add_done_callback(self._ending.discard)

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            """The two transports; the end of an MCP session (streamable HTTP's DELETE, an SSE
            stream closed) ends its session of ours. An MCP session is its tenant's: the SDK
            answers another principal's request for it as for an unknown session (404)."""
            scope = {**scope, "user": mcp_server.tenant_user(tenant_of(scope))}
            path: str = scope["path"]
            if path.startswith("/mcp/messages"):
                await sse(scope, receive, send)
            elif path == "/mcp/sse":
                opened: list[str] = []

                async def sniff(message: Message) -> None:
                    if not opened and message["type"] == "http.response.body":
                        found = _SSE_SESSION.search(message.get("body", b""))
                        if found:
                            opened.append(found.group(1).decode())
                    await send(message)

                try:
                    await sse(scope, receive, sniff)
                finally:
                    if opened:
                        end_later(opened[0], scope)
            else:
                headers = dict(scope["headers"])
                opening = scope["method"] == "POST" and b"mcp-session-id" not in headers
                refused = over_share(tenant_of(scope)) if opening else None
                if refused is not None:
                    await _too_many_sessions(refused)(scope, receive, send)
                    return
                await streamable(scope, receive, send)
                mcp_session = headers.get(b"mcp-session-id")
                if scope["method"] == "DELETE" and mcp_session is not None:
                    end_later(mcp_session.decode("latin-1"), scope)

        self.app = app

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the streamable-HTTP session manager for the API's life."""
        if self._server is None:
            yield
            return
        async with self._server.session_manager.run():
            yield


def _too_many_sessions(why: str) -> JSONResponse:
    """429 in the transport's JSON-RPC error shape (the SDK answers its own process-wide limit
    so, with 503)."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": why}}
    return JSONResponse(body, status_code=429, headers={"Retry-After": str(RETRY_AFTER_S)})
