"""An E2B sandbox's data plane (ASGI I/O of e2b_interpreter.py): `run_code` as a streamed cell of
the sandbox's session, the contexts, and envd's files, each a cell on our dispatcher.

A sandbox is one session of ours, `scoped(owner, "e2b-<sandbox>")`: one jail, one filesystem,
one interpreter. Its code contexts are namespaces of that interpreter (e2b_inside.py keeps the
others aside while one runs), so every context sees the files `sandbox.files` writes and the
commands leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

from redis.exceptions import RedisError
from starlette.types import Receive, Send

from sandbox_service.api.answers import send_bytes_counted
from sandbox_service.api.compat import e2b_envd as envd
from sandbox_service.api.compat import e2b_interpreter as interpreter
from sandbox_service.api.compat.asgi_io import (
    disconnected,
    read_body,
    send_bytes,
    send_json,
    send_text,
)
from sandbox_service.api.compat.e2b import (
    DEFAULT_CONTEXT,
    KEEPALIVE_S,
    MAX_CONTEXTS,
    ApiError,
    SandboxRecord,
)
from sandbox_service.api.compat.e2b_store import SandboxStore
from sandbox_service.api.context import ApiContext
from sandbox_service.api.dispatch import Overloaded, Unavailable
from sandbox_service.jobs import JobPayload
from sandbox_service.logs import request_id_var
from sandbox_service.tenancy import Tenant, scoped, tenant_var
from trainer_client.wire import ExecuteResult

log = logging.getLogger(__name__)

ROUTE = "/e2b"
LOCK_MARGIN_S = 30.0
"""The route label of E2B cells in the API's metrics."""
CELL_MEMORY_MB = 1024


class SandboxPlane:
    """Cells, contexts and files of E2B sandboxes."""

    def __init__(self, ctx: ApiContext, store: SandboxStore) -> None:
        self._ctx = ctx
        self._store = store
        self.memory_mb = min(CELL_MEMORY_MB, ctx.settings.max_memory_mb)
        """A cell's memory limit (also reported as the sandbox's `memoryMB`)."""

    @staticmethod
    def _session(record: SandboxRecord) -> str:
        return scoped(Tenant(record.tenant), f"e2b-{record.sandbox_id}")

    def _lock(self, sandbox_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The sandbox's lock for a context's switch and its cell (a switch cell, an `envs`
        cell and the cell itself, each up to `max_timeout`, and margin)."""
        return self._store.locked(sandbox_id, 3 * self._ctx.settings.max_timeout + LOCK_MARGIN_S)

    async def end_sandbox(self, record: SandboxRecord) -> None:
        """End a killed sandbox's session: its jail, its files, its commands."""
        with contextlib.suppress(Overloaded, Unavailable, RedisError, OSError):
            await self._ctx.dispatcher.end_session(self._session(record), request_id_var.get())

    async def cell(
        self, record: SandboxRecord, code: str, timeout_s: float | None = None, **extra: Any
    ) -> ExecuteResult:
        """One cell of the sandbox's session."""
        payload = JobPayload(
            code=code,
            timeout_s=min(timeout_s or math.inf, self._ctx.settings.max_timeout),
            memory_mb=self.memory_mb,
            session_id=self._session(record),
            request_id=request_id_var.get(),
            keep_processes=True,  # an E2B sandbox's processes live on, as on its VM
            **extra,
        )
        (result,) = await self._ctx.run([payload], ROUTE)
        return ExecuteResult.model_validate(result)

    async def op(
        self, record: SandboxRecord, args: dict[str, Any], timeout_s: float | None = None
    ) -> tuple[dict[str, Any] | None, ExecuteResult]:
        """Run one e2b_inside.py op in the sandbox: its answer (None: the cell did not finish
        it) and the cell's result."""
        result = await self.cell(record, envd.op_cell(args), timeout_s)
        return (envd.parse_answer(result.stdout) if result.status == "ok" else None), result

    # --- the code interpreter ------------------------------------------------------------------

    async def execute(self, receive: Receive, send: Send, record: SandboxRecord) -> None:
        """`POST /execute` of the code interpreter (`run_code`)."""
        cell = interpreter.parse_cell(await read_body(receive))
        if isinstance(cell, ApiError):
            await send_text(send, cell.code, cell.message)
            return
        if len(cell.code.encode()) > self._ctx.settings.max_code_bytes:
            await send_text(send, 400, f"code over {self._ctx.settings.max_code_bytes} bytes")
            return
        if cell.context_id not in await self._store.contexts(record.sandbox_id):
            await send_text(send, 404, f"context {cell.context_id} not found")
            return
        env_vars = {**record.env_vars, **cell.env_vars}
        running = asyncio.create_task(self._run(record, cell.context_id, cell.code, env_vars))
        await self._stream(running, receive, send, record, cell)

    async def _run(
        self, record: SandboxRecord, context_id: str, code: str, env_vars: dict[str, str]
    ) -> ExecuteResult:
        if context_id == DEFAULT_CONTEXT and not await self._store.has_contexts(record.sandbox_id):
            return await self._cells(record, code, env_vars)  # one namespace: nothing to switch
        async with self._lock(record.sandbox_id):
            await self.cell(record, envd.op_cell(envd.context_op(context_id)))
            return await self._cells(record, code, env_vars)

    async def _cells(
        self, record: SandboxRecord, code: str, env_vars: dict[str, str]
    ) -> ExecuteResult:
        if env_vars:
            await self.cell(record, interpreter.env_cell(env_vars))
        return await self.cell(record, code)

    async def _stream(
        self,
        running: asyncio.Task[ExecuteResult],
        receive: Receive,
        send: Send,
        record: SandboxRecord,
        cell: interpreter.Cell,
    ) -> None:
        """Answer a cell: a refusal before the stream starts is an HTTP status (429, 503); after
        KEEPALIVE_S without an answer the stream starts with a keepalive line, one more follows
        every KEEPALIVE_S, and a client that leaves cancels the cell (then or before)."""
        try:
            await asyncio.wait({running}, timeout=KEEPALIVE_S)
        except asyncio.CancelledError:  # the Edge: the client left before the answer started
            running.cancel()
            raise
        if running.done() and running.exception() is not None:
            await self._refused(send, running.exception())
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/x-ndjson")],
            }
        )
        left = asyncio.create_task(disconnected(receive))
        keepalive = {"type": "http.response.body", "body": interpreter.KEEPALIVE, "more_body": True}
        try:
            while not running.done():
                await send(keepalive)
                await asyncio.wait(
                    {running, left}, timeout=KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED
                )
                if left.done():
                    running.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await running
                    return
            lines = await self._finished_lines(running, record, cell)
            await send({"type": "http.response.body", "body": lines + interpreter.END})
        except asyncio.CancelledError:
            running.cancel()
            raise
        finally:
            left.cancel()

    async def _finished_lines(
        self, running: asyncio.Task[ExecuteResult], record: SandboxRecord, cell: interpreter.Cell
    ) -> bytes:
        error = running.exception()
        if error is not None:
            name = "QueueFull" if isinstance(error, Overloaded) else "SandboxError"
            value = str(error)
            line = {"type": "error", "name": name, "value": value, "traceback": f"{name}: {value}"}
            return interpreter.encode_lines([line])
        result = running.result()
        count = await self._store.count_cell(record.sandbox_id, cell.context_id)
        earlier = []
        if result.error is not None:
            earlier = await self._store.cells(record.sandbox_id, cell.context_id)
        lines = interpreter.cell_lines(result, count, time.time_ns(), cell.code, earlier)
        await self._store.record_cell(record, cell.context_id, count, cell.code)
        return interpreter.encode_lines(lines)

    async def _refused(self, send: Send, error: BaseException | None) -> None:
        if isinstance(error, Overloaded):
            self._ctx.metrics.reject("queue_full", tenant_var.get().name)
            await send_text(send, 429, f"{error}; retry later")
        elif isinstance(error, Unavailable | RedisError | OSError):
            await send_text(send, 503, str(error))
        else:
            log.error("E2B cell failed", exc_info=error)
            await send_text(send, 503, "the cell could not be run")

    async def contexts(
        self, method: str, rest: list[str], receive: Receive, send: Send, record: SandboxRecord
    ) -> None:
        """`/contexts` calls: create, list, delete, restart."""
        contexts = await self._store.contexts(record.sandbox_id)
        if not rest and method == "POST":
            spec = interpreter.parse_new_context(await read_body(receive))
            if isinstance(spec, ApiError):
                await send_text(send, spec.code, spec.message)
            elif len(contexts) > MAX_CONTEXTS:
                await send_text(send, 400, f"at most {MAX_CONTEXTS} contexts per sandbox")
            else:
                context_id = interpreter.new_context_id()
                await self._store.add_context(record, context_id)
                await send_json(send, 200, interpreter.context_body(context_id))
            return
        if not rest and method == "GET":
            await send_json(send, 200, [interpreter.context_body(c) for c in contexts])
            return
        context_id = rest[0] if rest else ""
        if context_id not in contexts:
            await send_text(send, 404, f"context {context_id[:64]} not found")
            return
        if len(rest) == 1 and method == "DELETE":
            await self._store.remove_context(record.sandbox_id, context_id)
            await self._forget_namespace(record, context_id, drop=True)
            await send_bytes(send, 204)
        elif rest[1:] == ["restart"] and method == "POST":
            await self._forget_namespace(record, context_id)
            await self._store.reset_context(record.sandbox_id, context_id)
            await send_bytes(send, 204)
        else:
            await send_text(send, 405, "method not allowed")

    async def _forget_namespace(
        self, record: SandboxRecord, context_id: str, drop: bool = False
    ) -> None:
        """A restarted or removed context's variables are gone (the sandbox's files stay)."""
        forget = envd.context_op(context_id, reset=True, drop=drop)
        with contextlib.suppress(Overloaded, Unavailable):
            async with self._lock(record.sandbox_id):
                await self.cell(record, envd.op_cell(forget))

    # --- envd's files --------------------------------------------------------------------------

    async def write(
        self,
        receive: Receive,
        send: Send,
        record: SandboxRecord,
        content_type: str,
        path: str | None,
    ) -> None:
        """`POST /files` of envd (`files.write`)."""
        uploaded = interpreter.uploaded_files(content_type, await read_body(receive), path)
        if isinstance(uploaded, ApiError):
            await send_json(send, 400, {"message": uploaded.message, "code": 400})
            return
        jailed: list[tuple[str, bytes]] = []
        for name, data in uploaded:
            target = interpreter.jail_path(name)
            if isinstance(target, ApiError):
                await send_json(send, 400, {"message": target.message, "code": 400})
                return
            jailed.append((target, data))
        if sum(len(data) for _, data in jailed) > self._ctx.settings.max_files_bytes:
            why = f"files over {self._ctx.settings.max_files_bytes} bytes"
            await send_json(send, 400, {"message": why, "code": 400})
            return
        result = await self._file_cell(send, record, files=interpreter.encode_files(jailed))
        if result is None:
            return
        if result.status != "ok":
            why = f"the files could not be written: {result.stderr.strip()[:500]}"
            await send_json(send, 400, {"message": why, "code": 400})
            return
        await send_json(send, 200, [interpreter.write_info(name) for name, _ in jailed])

    async def read(self, send: Send, record: SandboxRecord, path: str | None) -> None:
        """`GET /files` of envd (`files.read`)."""
        if path is None:
            await send_json(send, 400, {"message": "path is required", "code": 400})
            return
        target = interpreter.jail_path(path)
        if isinstance(target, ApiError):
            await send_json(send, 400, {"message": target.message, "code": 400})
            return
        result = await self._file_cell(send, record, fetch_files=(target,))
        if result is None:
            return
        if target not in result.files:
            why = f"path '{path[:200]}' does not exist or is not a readable file"
            await send_json(send, 404, {"message": why, "code": 404})
            return
        data = interpreter.decode_file(result.files[target])
        del result  # its base64 copy: only the bytes are held while the client reads them
        refused = await send_bytes_counted(
            send, data, "application/octet-stream", self._ctx.answers
        )
        if refused is not None:
            await send_json(send, 503, {"message": refused, "code": 503})

    async def _file_cell(
        self, send: Send, record: SandboxRecord, **extra: Any
    ) -> ExecuteResult | None:
        try:
            return await self.cell(record, "", **extra)
        except Overloaded as exc:
            self._ctx.metrics.reject("queue_full", tenant_var.get().name)
            await send_json(send, 429, {"message": f"{exc}; retry later", "code": 429})
        except Unavailable as exc:
            await send_json(send, 503, {"message": str(exc), "code": 503})
        return None
