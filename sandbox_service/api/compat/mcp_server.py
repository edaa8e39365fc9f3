"""An MCP server (the official `mcp` SDK, 2.x) with two tools: `python`, stateful (one
session of ours per MCP session), and `python_stateless`. Rich outputs come back as MCP image
content (mcp_content.py says what the text holds).

Three transports: streamable HTTP at `/mcp` and SSE at `/mcp/sse` of the service
(compat/wires.py sends them there; the Edge has checked the key, and the tenant of the request
names the session), and stdio (`rl-sandbox mcp --url ...`, a process that calls a running
service over HTTP with our client).
A session of ours is named by its MCP session's id; it ends with the MCP session (mcp_routes.py
and run_stdio pass the end on), else `session_ttl_s` after its last call.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, ContentBlock, ImageContent, TextContent

from sandbox_service import __version__
from sandbox_service.api.compat import mcp_content
from sandbox_service.api.compat.mcp_handshake import SERVER_NAME
from trainer_client.wire import ExecuteResult

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
RunCode = Callable[[str, str | None, float, str], Awaitable[ExecuteResult]]
"""(code, session id or None, timeout in seconds, tenant name) -> the result."""
TENANT_HEADER = "x-rl-sandbox-tenant"
"""Set by compat/wires.py from the request's tenant (a client's own value is dropped)."""
DEFAULT_TIMEOUT_S = 10.0
SESSION_ID = re.compile(r"[A-Za-z0-9_-]{8,128}")


def _content(result: ExecuteResult) -> CallToolResult:
    blocks: list[ContentBlock] = [TextContent(type="text", text=mcp_content.tool_text(result))]
    blocks += [
        ImageContent(type="image", data=png, mime_type="image/png")
        for png in mcp_content.tool_images(result)
    ]
    return CallToolResult(content=blocks, is_error=mcp_content.is_error(result))


def build_server(
    run: RunCode, max_timeout_s: float, process_session: str = "", log_level: LogLevel = "INFO"
) -> MCPServer:
    """The MCP server whose tools run code through `run`; `process_session` is the session of
    a stdio server (its one client). The SDK configures the root logger at `log_level` where
    nothing did before (a stdio server, whose host shows stderr)."""
    server = MCPServer(
        name=SERVER_NAME,
        version=__version__,
        instructions=mcp_content.TOOL_DESCRIPTION,
        log_level=log_level,
    )

    def tenant_of(ctx: Context) -> str:
        headers = ctx.headers or {}
        return headers.get(TENANT_HEADER, "default")

    def session_of(ctx: Context) -> str | None:
        """Our session of this MCP session: over HTTP named by its id (streamable HTTP's
        `mcp-session-id` header, SSE's `session_id` query; random, the SDK's), over stdio the
        process's own; None for a request outside any MCP session."""
        request = ctx.request_context.request
        if request is None:
            return process_session
        mcp_session = request.headers.get("mcp-session-id")
        if mcp_session is None:
            query = getattr(request, "query_params", None)
            mcp_session = query.get("session_id") if query is not None else None
        if mcp_session is None or not SESSION_ID.fullmatch(mcp_session):
            return None
        return session_name(mcp_session)

    def limit(timeout: float) -> float:
        return mcp_content.tool_timeout(timeout, DEFAULT_TIMEOUT_S, max_timeout_s)

    @server.tool(name="python", description=mcp_content.TOOL_DESCRIPTION, structured_output=False)
    async def python(
        code: str,
        ctx: Context,
        timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 (the tool's)
    ) -> CallToolResult:
        result = await run(code, session_of(ctx), limit(timeout), tenant_of(ctx))
        return _content(result)

    @server.tool(
        name="python_stateless",
        description=mcp_content.STATELESS_DESCRIPTION,
        structured_output=False,
    )
    async def python_stateless(
        code: str,
        ctx: Context,
        timeout: float = DEFAULT_TIMEOUT_S,  # noqa: ASYNC109 (the tool's)
    ) -> CallToolResult:
        result = await run(code, None, limit(timeout), tenant_of(ctx))
        return _content(result)

    return server


def session_name(mcp_session_id: str) -> str:
    """Our session id of an MCP session (before the tenant's scope)."""
    return f"mcp-{mcp_session_id}"


def tenant_user(tenant: str) -> AuthenticatedUser:
    """The principal of a tenant's requests (the ASGI scope's `user`): both transports bind an
    MCP session to the principal that opened it."""
    return AuthenticatedUser(AccessToken(token="", client_id=tenant, scopes=[]))


def http_app(server: MCPServer, max_sessions: int) -> Any:
    """The streamable-HTTP ASGI app at `/mcp` (its session manager runs in the API's lifespan).
    DNS-rebinding protection is off: the service is reached by name from other hosts, and the
    API key (the Edge) is what guards it."""
    return server.streamable_http_app(
        streamable_http_path="/mcp",
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_sessions=max_sessions,
    )


def open_sessions(server: MCPServer, tenant: str) -> int:
    """Streamable-HTTP sessions `tenant` holds open now: the session manager binds each to the
    principal that opened it (tenant_user), until its DELETE or its idle timeout."""
    owners = server.session_manager._session_owners  # the SDK keeps the only record of it
    return sum(1 for owner in owners.values() if owner["client_id"] == tenant)


def sse_app(server: MCPServer) -> Any:
    """The SSE transport's ASGI app: `GET /mcp/sse`, `POST /mcp/messages/` (vLLM's
    `--tool-server <host>:<port>/mcp` connects to `http://<host>:<port>/mcp/sse`)."""
    return server.sse_app(
        sse_path="/mcp/sse",
        message_path="/mcp/messages/",
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
