"""The HTTP edge every request passes: request id, API key and its tenant, body size cap, access
log, counts, and the cancellation of abandoned work.

The Bearer key is compared with every configured key (hmac.compare_digest, no early exit), so the
time of a refusal tells nothing of which key came close; the tenant found is bound in
`tenancy.tenant_var` for the request's task, where routes name its objects by it.

A plain ASGI middleware rather than Starlette's BaseHTTPMiddleware, which costs a task and a
stream per request; at thousands of requests in flight that matters.

Abandoned work (API.md): once a POST's body is read, a watcher awaits the server's next message;
`http.disconnect` before the response started means the client went away, and the request's task
is cancelled. The dispatcher then drops its jobs not started and has the running ones killed.
The request is logged and counted with status 499 (nginx's "client closed request").
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandbox_service.api.compat.e2b import api_key_of, is_control_path, target_of
from sandbox_service.logs import fields, request_id_from_header, request_id_var
from sandbox_service.tenancy import DEFAULT_TENANT, Tenant, tenant_var
from sandbox_service.tenants_file import Credential

log = logging.getLogger("sandbox_service.access")

CLIENT_CLOSED_REQUEST = 499
"""The status logged and counted for a request whose client went away before its answer."""

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""Paths served without the API key: the operational ones, which probes and scrapers call and
which cannot carry a secret (restrict them by network; they reveal no user data, and `/metrics`
no tenant's name or figure)."""
TENANT_METRICS_PATH = "/metrics/tenants"
"""The per-tenant series: a tenant's key gets its own, the operator key every tenant's."""
OPERATOR = "operator"
"""`scope["state"]` key, True when the request presented the operator key (on
TENANT_METRICS_PATH, the only path that key opens)."""

KNOWN_ROUTES = frozenset(
    {"/execute", "/execute/batch", "/healthz", "/readyz", "/metrics", "/docs", "/openapi.json"}
    | {TENANT_METRICS_PATH}
    | {"/run", "/run/batch", "/run/long-batch", "/run_code"}  # compat_routes
    | {"/sandboxes", "/v2/sandboxes", "/mcp"}  # compat/wires
)


class _BodyTooLarge(Exception):
    pass


class Edge:
    """ASGI middleware: X-Request-ID in and out, Bearer auth, 413 past max_body_bytes, logging."""

    def __init__(
        self,
        app: ASGIApp,
        credentials: tuple[Credential, ...],
        max_body_bytes: int,
        on_response: Callable[[str, int, str], None],
        operator_key: bytes | None = None,
    ) -> None:
        self.app = app
        self._credentials = credentials
        self._operator_key = operator_key
        self._max_body_bytes = max_body_bytes
        self._on_response = on_response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = dict(scope["headers"])
        request_id = request_id_from_header(_header(headers, b"x-request-id"))
        token = request_id_var.set(request_id)
        path: str = scope["path"]
        sandbox = target_of(path, headers)  # E2B's data plane: the sandbox's token (e2b_routes)
        route = "e2b-sandbox" if sandbox else path if path in KNOWN_ROUTES else "other"
        status = 500
        tenant: Tenant | None = DEFAULT_TENANT
        response_started = False
        watcher: asyncio.Task[None] | None = None
        disconnected = False
        request_task = asyncio.current_task()

        async def watch_disconnect() -> None:
            nonlocal disconnected
            message = await receive()
            if message["type"] == "http.disconnect" and not response_started:
                disconnected = True
                assert request_task is not None
                request_task.cancel()

        def on_body_read() -> None:
            nonlocal watcher
            if scope["method"] == "POST" and watcher is None:
                watcher = asyncio.create_task(watch_disconnect(), name="disconnect-watch")

        async def send_wrapper(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                ]
            await send(message)

        tenant_token = None
        label = DEFAULT_TENANT.name  # the metrics' tenant: "" for a request of no tenant
        try:
            if path == TENANT_METRICS_PATH and self._is_operator(headers):
                scope.setdefault("state", {})[OPERATOR] = True
                label = ""
            elif self._credentials:
                label = ""
                if path not in OPEN_PATHS and sandbox is None:
                    tenant = self._tenant_of(headers)
                    label = tenant.name if tenant is not None else ""
            if tenant is None:
                await _reply(
                    send_wrapper,
                    401,
                    "missing or invalid API key",
                    [(b"www-authenticate", b"Bearer")],
                    e2b_shape=is_control_path(path),  # the E2B SDK parses {"code", "message"}
                )
                return
            tenant_token = tenant_var.set(tenant)
            length = _header(headers, b"content-length")
            if length is not None and length.isdigit() and int(length) > self._max_body_bytes:
                await _reply(send_wrapper, 413, f"body over {self._max_body_bytes} bytes")
                return
            try:
                await self.app(scope, self._capped(receive, on_body_read), send_wrapper)
            except _BodyTooLarge:
                if not response_started:
                    await _reply(send_wrapper, 413, f"body over {self._max_body_bytes} bytes")
            except ClientDisconnect:  # gone mid-body, or closed at the server's body deadline
                status = CLIENT_CLOSED_REQUEST
            except asyncio.CancelledError:
                if not disconnected or request_task is None:
                    raise
                request_task.uncancel()  # our own cancellation: the request ends here
                status = CLIENT_CLOSED_REQUEST
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            self._on_response(route, status, label)
            log.info(
                "%s %s %d",
                scope["method"],
                path,
                status,
                extra=fields(status=status, duration=round(time.perf_counter() - started, 6)),
            )
            if tenant_token is not None:
                tenant_var.reset(tenant_token)
            request_id_var.reset(token)

    def _tenant_of(self, headers: dict[bytes, bytes]) -> Tenant | None:
        """The tenant whose key the request carries, or None (every key is compared)."""
        key = presented_key(headers)
        found = None
        for credential in self._credentials:
            if hmac.compare_digest(key or b"", credential.key):
                found = credential.tenant
        return found if key is not None else None

    def _is_operator(self, headers: dict[bytes, bytes]) -> bool:
        key = presented_key(headers)
        if self._operator_key is None or key is None:
            return False
        return hmac.compare_digest(key, self._operator_key)

    def _capped(self, receive: Receive, on_body_read: Callable[[], None]) -> Receive:
        seen = 0
        limit = self._max_body_bytes

        async def capped_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _BodyTooLarge
                if not message.get("more_body", False):
                    on_body_read()
            return message

        return capped_receive


def presented_key(headers: dict[bytes, bytes]) -> bytes | None:
    """The API key a request presents: `Authorization: Bearer <key>`, else the E2B SDK's
    `X-API-KEY` (its `e2b_<hex>` form decoded, e2b.api_key_of)."""
    scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
    if scheme.lower() == b"bearer":
        return key.strip()
    e2b_key = headers.get(b"x-api-key")
    return None if e2b_key is None else api_key_of(e2b_key)


def _header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    value = headers.get(name)
    return value.decode("latin-1") if value is not None else None


async def _reply(
    send: Send,
    status: int,
    detail: str,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
    e2b_shape: bool = False,
) -> None:
    shape = {"code": status, "message": detail} if e2b_shape else {}
    body = json.dumps({"detail": detail, **shape}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra_headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
