"""The E2B wire's I/O (ASGI): the control plane, and the data plane's authentication and routing
(its cells and files are e2b_sandbox.py's), on our dispatcher and Redis (e2b_store.py).

Served outside FastAPI's routing (compat/wires.py sends requests here by path or by the SDK's
sandbox headers), so these routes are not in the OpenAPI document; docs/compatibility.md is
their reference. Answers are E2B's: `{"code", "message"}` errors on the control plane, the text
or `{"message"}` bodies of envd and the code interpreter on the data plane.

One 5xx is answered on purpose: 502 on the data plane for a sandbox that is gone (killed, timed
out, never created, or named with a wrong access token), which is what E2B's proxy answers and
what the SDK reads as "not running" (`is_running() is False`, `TimeoutException` of run_code).
503 means Redis is unreachable, as on every route.
"""

from __future__ import annotations

import hmac
import time
from urllib.parse import parse_qs

from redis.exceptions import RedisError
from starlette.types import Receive, Scope, Send

from sandbox_service.api.compat import e2b
from sandbox_service.api.compat.asgi_io import read_body, send_bytes, send_json, send_text
from sandbox_service.api.compat.e2b import ApiError, SandboxRecord, Target
from sandbox_service.api.compat.e2b_rpc import EnvdRpc
from sandbox_service.api.compat.e2b_sandbox import SandboxPlane
from sandbox_service.api.compat.e2b_store import SandboxStore
from sandbox_service.api.context import ApiContext
from sandbox_service.tenancy import Tenant, configured, tenant_var


async def _error(send: Send, error: ApiError) -> None:
    await send_bytes(send, error.code, error.body())


class E2bWire:
    """The E2B control and data planes of one API process."""

    def __init__(self, ctx: ApiContext) -> None:
        self._ctx = ctx
        self._store = SandboxStore(ctx.dispatcher.redis, ctx.settings.queue_name)
        self._plane = SandboxPlane(ctx, self._store)
        self._rpc = EnvdRpc(self._plane, ctx.settings.max_output_bytes)
        self._max_timeout_s = ctx.settings.session_ttl_s
        self._tenants = {t.name: t for t in ctx.settings.tenants()}

    # --- the control plane ---------------------------------------------------------------------

    async def control(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`/sandboxes*` and `/v2/sandboxes*` (the Edge has checked the API key)."""
        try:
            await self._control(scope, receive, send)
        except (RedisError, OSError) as exc:
            await _error(send, ApiError(503, f"redis unavailable: {exc}"))

    async def _control(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        parts = scope["path"].strip("/").split("/")
        if parts[0] == "v2":
            parts = parts[1:]
        tenant = tenant_var.get()
        if parts == ["sandboxes"]:
            if method == "POST":
                await self._create(await read_body(receive), tenant, send)
            elif method == "GET":
                await self._list(scope, tenant, send)
            else:
                await _error(send, ApiError(405, f"{method} is not allowed here"))
            return
        if len(parts) < 2 or not e2b.SANDBOX_ID.fullmatch(parts[1]):
            await _error(send, ApiError(404, "sandbox not found"))
            return
        record = await self._store.get(parts[1])
        if record is None or record.tenant != tenant.name:
            await _error(send, ApiError(404, f"sandbox {parts[1]} not found"))
            return
        action = "/".join(parts[2:])
        if action == "" and method == "GET":
            await send_json(send, 200, e2b.detail_body(record, self._plane.memory_mb))
        elif action == "" and method == "DELETE":
            await self._store.delete(record)
            await self._plane.end_sandbox(record)
            await send_bytes(send, 204)
        elif action in ("timeout", "connect") and method == "POST":
            default = None if action == "timeout" else int(record.end_at - time.time()) + 1
            timeout = e2b.parse_timeout(await read_body(receive), self._max_timeout_s, default)
            if isinstance(timeout, ApiError):
                await _error(send, timeout)
                return
            record = record.with_timeout(time.time(), timeout)
            await self._store.put(record)
            if action == "timeout":
                await send_bytes(send, 204)
            else:
                await send_json(send, 200, e2b.created_body(record))
        else:
            why = f"{method} /sandboxes/{{id}}/{action} is not served by this server"
            await _error(send, ApiError(400 if method != "GET" else 404, why))

    async def _create(self, body: bytes, tenant: Tenant, send: Send) -> None:
        spec = e2b.parse_new_sandbox(body, self._max_timeout_s)
        if isinstance(spec, ApiError):
            await _error(send, spec)
            return
        if await self._ctx.dispatcher.queue_depth() >= self._ctx.settings.max_queue_depth:
            self._ctx.metrics.reject("queue_full", tenant_var.get().name)
            await _error(send, ApiError(429, "the queue is full; retry later"))
            return
        limit = self._ctx.settings.e2b_max_sandboxes
        if await self._store.count_owned(tenant.name) >= limit:
            why = f"at most {limit} live sandboxes per key; kill some or let them time out"
            await _error(send, ApiError(429, why))
            return
        now = time.time()
        record = SandboxRecord(
            sandbox_id=e2b.new_sandbox_id(),
            tenant=tenant.name,
            template_id=spec.template_id,
            access_token=e2b.new_token(),
            started_at=now,
            end_at=now + spec.timeout_s,
            metadata=spec.metadata,
            env_vars=spec.env_vars,
        )
        await self._store.put(record)
        await send_json(send, 201, e2b.created_body(record))

    async def _list(self, scope: Scope, tenant: Tenant, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        wanted = e2b.metadata_filter(query.get("metadata", [""])[0])
        states = ",".join(query.get("state", [])).split(",")
        records = await self._store.owned(tenant.name)
        if states != [""] and "running" not in states:
            records = []
        listed = [
            e2b.listed_body(r, self._plane.memory_mb)
            for r in records
            if all(r.metadata.get(k) == v for k, v in wanted.items())
        ]
        await send_json(send, 200, listed)

    # --- the data plane ------------------------------------------------------------------------

    async def data(self, scope: Scope, receive: Receive, send: Send, target: Target) -> None:
        """A request of the SDK's envd or code-interpreter clients (sandbox headers or Host)."""
        try:
            record = await self._authorized(scope, target)
        except (RedisError, OSError) as exc:
            await send_text(send, 503, f"redis unavailable: {exc}")
            return
        if record is None:
            gone = {"message": "the sandbox was not found", "sandboxId": target.sandbox_id[:64]}
            await send_json(send, 502, {**gone, "code": 502})
            return
        # The creating key's tenant, quotas and share included: the data plane carries no key.
        token = tenant_var.set(configured(self._tenants, record.tenant))
        try:
            await self._route_data(scope, receive, send, target, record)
        except (RedisError, OSError) as exc:
            await send_text(send, 503, f"redis unavailable: {exc}")
        finally:
            tenant_var.reset(token)

    async def _authorized(self, scope: Scope, target: Target) -> SandboxRecord | None:
        """The sandbox named, if the request carries its access token (the SDK sends no API key
        on the data plane: the token, which only the creating key received, is the credential)."""
        if not e2b.SANDBOX_ID.fullmatch(target.sandbox_id):
            return None
        record = await self._store.get(target.sandbox_id)
        if record is None:
            return None
        headers = dict(scope["headers"])
        presented = headers.get(b"x-access-token") or headers.get(b"e2b-traffic-access-token")
        if presented is None or not hmac.compare_digest(presented, record.access_token.encode()):
            return None
        return record

    async def _route_data(
        self, scope: Scope, receive: Receive, send: Send, target: Target, record: SandboxRecord
    ) -> None:
        method: str = scope["method"]
        path: str = scope["path"]
        plane = self._plane
        if path == "/health" and method == "GET":
            await send_bytes(send, 204)
        elif target.port == e2b.JUPYTER_PORT and path == "/execute" and method == "POST":
            await plane.execute(receive, send, record)
        elif target.port == e2b.JUPYTER_PORT and path.strip("/").split("/")[0] == "contexts":
            await plane.contexts(method, path.strip("/").split("/")[1:], receive, send, record)
        elif target.port == e2b.ENVD_PORT and path == "/files" and method in ("GET", "POST"):
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            file_path = query.get("path", [None])[0]
            headers = dict(scope["headers"])
            if method == "GET":
                await plane.read(send, record, file_path)
            elif headers.get(b"content-encoding", b"identity") != b"identity":
                await send_json(send, 400, {"message": "compressed uploads are not served"})
            else:
                content_type = headers.get(b"content-type", b"").decode("latin-1")
                await plane.write(receive, send, record, content_type, file_path)
        elif target.port == e2b.ENVD_PORT and "." in path.split("/")[1]:
            # envd's Connect RPC: filesystem.Filesystem/* and process.Process/* (commands)
            headers = dict(scope["headers"])
            await self._rpc.serve(method, path, headers, receive, send, record)
        else:
            await self._refuse(send, target, method, path)

    async def _refuse(self, send: Send, target: Target, method: str, path: str) -> None:
        message = f"{method} {path} on port {target.port} is not served by this sandbox"
        await send_json(send, 404, {"message": message, "code": 404})
