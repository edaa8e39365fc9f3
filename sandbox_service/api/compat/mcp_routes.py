"""The MCP server of mcp_server.py inside the API process: its tools run on our dispatcher, and
its sessions are named in the tenant of the request (see wires.py, which passes it on)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sandbox_service.api.context import ApiContext
from sandbox_service.jobs import JobPayload
from sandbox_service.logs import request_id_var
from sandbox_service.tenancy import Tenant, scoped
from trainer_client.wire import ExecuteResult

ROUTE = "/mcp"
MEMORY_MB = 1024


class McpMount:
    """The `/mcp` ASGI app and the lifespan of its session manager; None parts without `mcp`."""

    def __init__(self, ctx: ApiContext) -> None:
        try:
            from sandbox_service.api.compat import mcp_server
        except ImportError:  # the `mcp` extra is not installed: no /mcp
            self.app: Any = None
            self._server: Any = None
            return

        async def run(
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

        self._server = mcp_server.build_server(run, ctx.settings.max_timeout)
        streamable = mcp_server.http_app(self._server)
        sse = mcp_server.sse_app(self._server)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            path: str = scope["path"]
            target = sse if path == "/mcp/sse" or path.startswith("/mcp/messages") else streamable
            await target(scope, receive, send)

        self.app = app

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the streamable-HTTP session manager for the API's life."""
        if self._server is None:
            yield
            return
        async with self._server.session_manager.run():
            yield
