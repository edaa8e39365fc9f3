"""The ASGI layer in front of FastAPI's routing that sends the peer wires whose paths or shapes
would clash with ours to their own handlers; every other request goes on to FastAPI untouched.

    request                                          handled by
    E2B sandbox headers (or a `<port>-<id>.` Host)    e2b_routes: the data plane
    /sandboxes*, /v2/sandboxes*                        e2b_routes: the control plane
    /mcp, /mcp/sse, /mcp/messages/                    mcp_routes (when `mcp` is installed)
    POST /execute whose body has `generated_code`     nemo: the NeMo-Skills sandbox wire
    DELETE /sessions/{id} with an `X-Session-ID`      nemo: its session delete (200/404)
    GET /health                                       nemo: its readiness probe
    POST /open-instruct/execute                       openinstruct: its Python tool

It sits inside the Edge (request id, API key, body cap, access log, disconnects). A native
`POST /execute` pays one scan of its body for the NeMo-Skills key.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sandbox_service.api.compat.asgi_io import read_body, replaying
from sandbox_service.api.compat.e2b import is_control_path, target_of
from sandbox_service.api.compat.e2b_routes import E2bWire
from sandbox_service.api.compat.nemo import is_nemo_body
from sandbox_service.api.compat.nemo_routes import NemoWire
from sandbox_service.api.compat.openinstruct import PATH as OPEN_INSTRUCT_PATH
from sandbox_service.tenancy import tenant_var


class PeerWires:
    """ASGI middleware dispatching E2B, MCP and NeMo-Skills requests before FastAPI routes."""

    def __init__(
        self, app: ASGIApp, e2b: E2bWire, nemo: NemoWire, mcp: ASGIApp | None = None
    ) -> None:
        self.app = app
        self._e2b = e2b
        self._nemo = nemo
        self._mcp = mcp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        target = target_of(path, dict(scope["headers"]))
        if target is not None:
            await self._e2b.data(scope, receive, send, target)
        elif is_control_path(path):
            await self._e2b.control(scope, receive, send)
        elif self._mcp is not None and (path == "/mcp" or path.startswith("/mcp/")):
            await self._mcp(_with_tenant(scope), receive, send)
        elif (
            scope["method"] == "DELETE"
            and path.startswith("/sessions/")
            and any(name == b"x-session-id" for name, _ in scope["headers"])
        ):
            await self._nemo.delete(path[len("/sessions/") :], send)
        elif path == "/health" and scope["method"] == "GET":
            await self._nemo.health(send)
        elif path == OPEN_INSTRUCT_PATH and scope["method"] == "POST":
            await self._nemo.open_instruct(await read_body(receive), send)
        elif path == "/execute" and scope["method"] == "POST":
            body = await read_body(receive)
            if is_nemo_body(body):
                await self._nemo.execute(scope, body, send)
            else:
                await self.app(scope, replaying(body, receive), send)
        else:
            await self.app(scope, receive, send)


def _with_tenant(scope: Scope) -> Scope:
    """The scope with the request's tenant in the header the MCP tools read (mcp_server.py);
    a client's own header of that name is dropped."""
    headers = [(k, v) for k, v in scope["headers"] if k != b"x-rl-sandbox-tenant"]
    headers.append((b"x-rl-sandbox-tenant", tenant_var.get().name.encode()))
    return {**scope, "headers": headers}
