"""The E2B wire's I/O (ASGI): the control plane and the data plane of e2b.py on our dispatcher.

Served outside FastAPI's routing (compat/wires.py sends requests here by path or by the SDK's
sandbox headers), so these routes are not in the OpenAPI document; docs/compatibility.md is
their reference. Answers are E2B's: `{"code", "message"}` errors on the control plane, the text
or `{"message"}` bodies of envd and the code interpreter on the data plane.

One 5xx is answered on purpose: 502 on the data plane for a sandbox that is gone (killed, timed
out, never created, or named with a wrong access token), which is what E2B's proxy answers and
what the SDK reads as "not running" (`is_running() is False`, `TimeoutException` of run_code).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from redis.exceptions import RedisError
from starlette.types import Receive, Scope, Send

from sandbox_service.api.compat import e2b
from sandbox_service.api.compat.e2b import ApiError, SandboxRecord, Target
from sandbox_service.api.compat.e2b_store import SandboxStore
from sandbox_service.api.context import ApiContext
from sandbox_service.api.dispatch import Overloaded, Unavailable
from sandbox_service.jobs import JobPayload
from sandbox_service.logs import request_id_var
from sandbox_service.tenancy import Tenant, scoped, tenant_var
from trainer_client.wire import ExecuteResult

log = logging.getLogger(__name__)

ROUTE = "/e2b"
"""The route label of E2B cells in the API's metrics."""
CELL_MEMORY_MB = 1024


class E2bWire:
    """The E2B control and data planes of one API process."""

    def __init__(self, ctx: ApiContext) -> None:
        self._ctx = ctx
        self._store = SandboxStore(ctx.dispatcher.redis, ctx.settings.queue_name)
        self._max_timeout_s = ctx.settings.session_ttl_s

    # --- plumbing ------------------------------------------------------------------------------

    async def _body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        return b"".join(chunks)

    @staticmethod
    async def _send(
        send: Send, status: int, body: bytes = b"", content_type: str = "application/json"
    ) -> None:
        headers = [(b"content-length", str(len(body)).encode())]
        if body:
            headers.append((b"content-type", content_type.encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _json(self, send: Send, status: int, value: Any) -> None:
        await self._send(send, status, json.dumps(value).encode())

    async def _error(self, send: Send, error: ApiError) -> None:
        await self._send(send, error.code, error.body())

    def _session(self, record: SandboxRecord, context_id: str) -> str:
        return scoped(Tenant(record.tenant), f"e2b-{record.sandbox_id}-{context_id}")

    async def _end_session(self, session_id: str) -> None:
        with contextlib.suppress(Overloaded, Unavailable, RedisError, OSError):
            await self._ctx.dispatcher.end_session(session_id, request_id_var.get())

    async def _cell(
        self, record: SandboxRecord, context_id: str, code: str, **extra: Any
    ) -> ExecuteResult:
        payload = JobPayload(
            code=code,
            timeout_s=self._ctx.settings.max_timeout,
            memory_mb=min(CELL_MEMORY_MB, self._ctx.settings.max_memory_mb),
            session_id=self._session(record, context_id),
            request_id=request_id_var.get(),
            **extra,
        )
        (result,) = await self._ctx.run([payload], ROUTE)
        return ExecuteResult.model_validate(result)

    # --- the control plane ---------------------------------------------------------------------

    async def control(self, scope: Scope, receive: Receive, send: Send) -> None:
        """`/sandboxes*` and `/v2/sandboxes*` (the Edge has checked the API key)."""
        try:
            await self._control(scope, receive, send)
        except (RedisError, OSError) as exc:
            await self._error(send, ApiError(503, f"redis unavailable: {exc}"))

    async def _control(self, scope: Scope, receive: Receive, send: Send) -> None:
        method: str = scope["method"]
        parts = scope["path"].strip("/").split("/")
        if parts[0] == "v2":
            parts = parts[1:]
        tenant = tenant_var.get()
        if parts == ["sandboxes"]:
            if method == "POST":
                await self._create(await self._body(receive), tenant, send)
            elif method == "GET":
                await self._list(scope, tenant, send)
            else:
                await self._error(send, ApiError(405, f"{method} is not allowed here"))
            return
        if len(parts) < 2 or not e2b.SANDBOX_ID.fullmatch(parts[1]):
            await self._error(send, ApiError(404, "sandbox not found"))
            return
        record = await self._store.get(parts[1])
        if record is None or record.tenant != tenant.name:
            await self._error(send, ApiError(404, f"sandbox {parts[1]} not found"))
            return
        action = "/".join(parts[2:])
        if action == "" and method == "GET":
            memory = min(CELL_MEMORY_MB, self._ctx.settings.max_memory_mb)
            await self._json(send, 200, e2b.detail_body(record, memory))
        elif action == "" and method == "DELETE":
            for context_id in await self._store.delete(record):
                await self._end_session(self._session(record, context_id))
            await self._send(send, 204)
        elif action in ("timeout", "connect") and method == "POST":
            default = None if action == "timeout" else int(record.end_at - time.time()) + 1
            timeout = e2b.parse_timeout(await self._body(receive), self._max_timeout_s, default)
            if isinstance(timeout, ApiError):
                await self._error(send, timeout)
                return
            record = record.with_timeout(time.time(), timeout)
            await self._store.put(record)
            if action == "timeout":
                await self._send(send, 204)
            else:
                await self._json(send, 200, e2b.created_body(record))
        else:
            why = f"{method} /sandboxes/{{id}}/{action} is not served by this server"
            await self._error(send, ApiError(400 if method != "GET" else 404, why))

    async def _create(self, body: bytes, tenant: Tenant, send: Send) -> None:
        spec = e2b.parse_new_sandbox(body, self._max_timeout_s)
        if isinstance(spec, ApiError):
            await self._error(send, spec)
            return
        if await self._ctx.dispatcher.queue_depth() >= self._ctx.settings.max_queue_depth:
            self._ctx.metrics.rejected.labels("queue_full").inc()
            await self._error(send, ApiError(429, "the queue is full; retry later"))
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
        await self._json(send, 201, e2b.created_body(record))

    async def _list(self, scope: Scope, tenant: Tenant, send: Send) -> None:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        wanted = e2b.metadata_filter(query.get("metadata", [""])[0])
        states = ",".join(query.get("state", [])).split(",")
        records = await self._store.owned(tenant.name)
        if states != [""] and "running" not in states:
            records = []
        memory = min(CELL_MEMORY_MB, self._ctx.settings.max_memory_mb)
        listed = [
            e2b.listed_body(r, memory)
            for r in records
            if all(r.metadata.get(k) == v for k, v in wanted.items())
        ]
        await self._json(send, 200, listed)

    # --- the data plane ------------------------------------------------------------------------

    async def data(self, scope: Scope, receive: Receive, send: Send, target: Target) -> None:
        """A request of the SDK's envd or code-interpreter clients (sandbox headers or Host)."""
        try:
            record = await self._authorized(scope, target)
        except (RedisError, OSError) as exc:
            await self._send(send, 503, f"redis unavailable: {exc}".encode(), "text/plain")
            return
        if record is None:
            gone = {"message": "the sandbox was not found", "sandboxId": target.sandbox_id[:64]}
            await self._send(send, 502, json.dumps({**gone, "code": 502}).encode())
            return
        token = tenant_var.set(Tenant(record.tenant))
        try:
            await self._route_data(scope, receive, send, target, record)
        except (RedisError, OSError) as exc:
            await self._send(send, 503, f"redis unavailable: {exc}".encode(), "text/plain")
        finally:
            tenant_var.reset(token)

    async def _authorized(self, scope: Scope, target: Target) -> SandboxRecord | None:
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
        handler: Callable[[], Awaitable[None]] | None = None
        if path == "/health" and method == "GET":
            await self._send(send, 204)
            return
        if target.port == e2b.JUPYTER_PORT:
            parts = path.strip("/").split("/")
            if path == "/execute" and method == "POST":
                handler = lambda: self._execute(receive, send, record)  # noqa: E731
            elif parts[0] == "contexts":
                handler = lambda: self._contexts(method, parts[1:], receive, send, record)  # noqa: E731
        elif target.port == e2b.ENVD_PORT and path == "/files":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            file_path = query.get("path", [None])[0]
            if method == "POST":
                headers = dict(scope["headers"])
                content_type = headers.get(b"content-type", b"").decode("latin-1")
                if headers.get(b"content-encoding", b"identity") != b"identity":
                    why = {"message": "compressed uploads are not served", "code": 400}
                    await self._json(send, 400, why)
                    return
                handler = lambda: self._write(receive, send, record, content_type, file_path)  # noqa: E731
            elif method == "GET":
                handler = lambda: self._read(send, record, file_path)  # noqa: E731
        if handler is not None:
            await handler()
            return
        await self._refuse(send, target, method, path)

    async def _refuse(self, send: Send, target: Target, method: str, path: str) -> None:
        if target.port == e2b.ENVD_PORT and "." in path.split("/")[1]:
            # envd's Connect RPC (process.Process/*: commands and pty; filesystem.Filesystem/*):
            # HTTP 404 is Connect's `unimplemented`.
            message = (
                f"{path} is not served: this sandbox runs Python cells in a jail with no shell "
                "(commands, pty) and serves only files.read and files.write of envd"
            )
            body = json.dumps({"code": "unimplemented", "message": message}).encode()
            await self._send(send, 404, body)
            return
        message = f"{method} {path} on port {target.port} is not served by this sandbox"
        await self._send(send, 404, json.dumps({"message": message, "code": 404}).encode())

    # --- the code interpreter ------------------------------------------------------------------

    async def _execute(self, receive: Receive, send: Send, record: SandboxRecord) -> None:
        body = await self._body(receive)
        cell = e2b.parse_cell(body)
        if isinstance(cell, ApiError):
            await self._send(send, cell.code, cell.message.encode(), "text/plain")
            return
        if len(cell.code.encode()) > self._ctx.settings.max_code_bytes:
            why = f"code over {self._ctx.settings.max_code_bytes} bytes"
            await self._send(send, 400, why.encode(), "text/plain")
            return
        contexts = await self._store.contexts(record.sandbox_id)
        if cell.context_id not in contexts:
            await self._send(
                send, 404, f"context {cell.context_id} not found".encode(), "text/plain"
            )
            return
        env_vars = {**record.env_vars, **cell.env_vars}
        running = asyncio.create_task(self._run_cell(record, cell.context_id, cell.code, env_vars))
        await self._stream(running, receive, send, record.sandbox_id, cell.context_id)

    async def _run_cell(
        self, record: SandboxRecord, context_id: str, code: str, env_vars: dict[str, str]
    ) -> ExecuteResult:
        if env_vars:
            await self._cell(record, context_id, e2b.env_cell(env_vars))
        return await self._cell(record, context_id, code)

    async def _stream(
        self,
        running: asyncio.Task[ExecuteResult],
        receive: Receive,
        send: Send,
        sandbox_id: str,
        context_id: str,
    ) -> None:
        """Answer a cell: a refusal before the stream starts is an HTTP status (429, 503); once
        the first keepalive is due the stream starts, and a client that leaves cancels the cell."""
        try:
            done, _ = await asyncio.wait({running}, timeout=e2b.KEEPALIVE_S)
        except asyncio.CancelledError:  # the client left before the answer started
            running.cancel()
            raise
        if done and running.exception() is not None:
            await self._refused(send, running.exception())
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/x-ndjson")],
            }
        )
        left = asyncio.create_task(_disconnected(receive))
        try:
            if not running.done():  # 5 s have passed without output
                await send(
                    {"type": "http.response.body", "body": e2b.keepalive_line(), "more_body": True}
                )
            while not running.done():
                await asyncio.wait(
                    {running, left}, timeout=e2b.KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED
                )
                if left.done():
                    running.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await running
                    return
                if not running.done():
                    await send(
                        {
                            "type": "http.response.body",
                            "body": e2b.keepalive_line(),
                            "more_body": True,
                        }
                    )
            lines = await self._finished_lines(running, sandbox_id, context_id)
            await send({"type": "http.response.body", "body": lines + e2b.end_line()})
        except asyncio.CancelledError:
            running.cancel()
            raise
        finally:
            left.cancel()

    async def _finished_lines(
        self, running: asyncio.Task[ExecuteResult], sandbox_id: str, context_id: str
    ) -> bytes:
        error = running.exception()
        if error is not None:
            name = "QueueFull" if isinstance(error, Overloaded) else "SandboxError"
            value = str(error)
            line = {"type": "error", "name": name, "value": value, "traceback": f"{name}: {value}"}
            return e2b.encode_lines([line])
        result = running.result()
        count = await self._store.count_cell(sandbox_id, context_id)
        return e2b.encode_lines(e2b.cell_lines(result, count, time.time_ns()))

    async def _refused(self, send: Send, error: BaseException | None) -> None:
        if isinstance(error, Overloaded):
            self._ctx.metrics.rejected.labels("queue_full").inc()
            await self._send(send, 429, f"{error}; retry later".encode(), "text/plain")
        elif isinstance(error, Unavailable | RedisError | OSError):
            await self._send(send, 503, str(error).encode(), "text/plain")
        else:
            log.error("E2B cell failed", exc_info=error)
            await self._send(send, 503, b"the cell could not be run", "text/plain")

    async def _contexts(
        self, method: str, rest: list[str], receive: Receive, send: Send, record: SandboxRecord
    ) -> None:
        contexts = await self._store.contexts(record.sandbox_id)
        if not rest and method == "POST":
            spec = e2b.parse_new_context(await self._body(receive))
            if isinstance(spec, ApiError):
                await self._send(send, spec.code, spec.message.encode(), "text/plain")
            elif len(contexts) > e2b.MAX_CONTEXTS:
                why = f"at most {e2b.MAX_CONTEXTS} contexts per sandbox"
                await self._send(send, 400, why.encode(), "text/plain")
            else:
                context_id = e2b.new_context_id()
                await self._store.add_context(record, context_id)
                await self._json(send, 200, e2b.context_body(context_id))
            return
        if not rest and method == "GET":
            await self._json(send, 200, [e2b.context_body(c) for c in contexts])
            return
        context_id = rest[0] if rest else ""
        if context_id not in contexts:
            await self._send(
                send, 404, f"context {context_id[:64]} not found".encode(), "text/plain"
            )
            return
        session = self._session(record, context_id)
        if len(rest) == 1 and method == "DELETE":
            await self._store.remove_context(record.sandbox_id, context_id)
            await self._end_session(session)
            await self._send(send, 204)
        elif rest[1:] == ["restart"] and method == "POST":
            await self._end_session(session)
            await self._store.reset_context(record.sandbox_id, context_id)
            await self._send(send, 204)
        else:
            await self._send(send, 405, b"method not allowed", "text/plain")

    # --- envd's files --------------------------------------------------------------------------

    async def _write(
        self,
        receive: Receive,
        send: Send,
        record: SandboxRecord,
        content_type: str,
        path: str | None,
    ) -> None:
        body = await self._body(receive)
        uploaded = e2b.uploaded_files(content_type, body, path)
        if isinstance(uploaded, ApiError):
            await self._json(send, 400, {"message": uploaded.message, "code": 400})
            return
        jailed: list[tuple[str, bytes]] = []
        for name, data in uploaded:
            target = e2b.jail_path(name)
            if isinstance(target, ApiError):
                await self._json(send, 400, {"message": target.message, "code": 400})
                return
            jailed.append((target, data))
        total = sum(len(data) for _, data in jailed)
        if total > self._ctx.settings.max_files_bytes:
            why = f"files over {self._ctx.settings.max_files_bytes} bytes"
            await self._json(send, 400, {"message": why, "code": 400})
            return
        result = await self._file_cell(send, record, files=e2b.encode_files(jailed))
        if result is None:
            return
        if result.status != "ok":
            why = f"the files could not be written: {result.stderr.strip()[:500]}"
            await self._json(send, 400, {"message": why, "code": 400})
            return
        await self._json(send, 200, [e2b.write_info(name) for name, _ in jailed])

    async def _read(self, send: Send, record: SandboxRecord, path: str | None) -> None:
        if path is None:
            await self._json(send, 400, {"message": "path is required", "code": 400})
            return
        target = e2b.jail_path(path)
        if isinstance(target, ApiError):
            await self._json(send, 400, {"message": target.message, "code": 400})
            return
        result = await self._file_cell(send, record, fetch_files=(target,))
        if result is None:
            return
        if target not in result.files:
            why = f"path '{path[:200]}' does not exist or is not a readable file"
            await self._json(send, 404, {"message": why, "code": 404})
            return
        data = e2b.decode_file(result.files[target])
        await self._send(send, 200, data, "application/octet-stream")

    async def _file_cell(
        self, send: Send, record: SandboxRecord, **extra: Any
    ) -> ExecuteResult | None:
        try:
            return await self._cell(record, e2b.DEFAULT_CONTEXT, "", **extra)
        except Overloaded as exc:
            self._ctx.metrics.rejected.labels("queue_full").inc()
            await self._json(send, 429, {"message": f"{exc}; retry later", "code": 429})
        except Unavailable as exc:
            await self._json(send, 503, {"message": str(exc), "code": 503})
        return None


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
