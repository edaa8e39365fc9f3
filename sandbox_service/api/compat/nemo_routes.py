"""The I/O of the small tool wires (ASGI, dispatched by compat/wires.py): NeMo-Skills' sandbox
(nemo.py) and open-instruct's Python tool (openinstruct.py)."""

from __future__ import annotations

from starlette.types import Scope, Send

from sandbox_service.api.compat import nemo, openinstruct
from sandbox_service.api.compat.asgi_io import send_json
from sandbox_service.api.context import ApiContext
from sandbox_service.api.dispatch import Overloaded, Unavailable
from sandbox_service.jobs import JobPayload
from sandbox_service.logs import request_id_var
from sandbox_service.tenancy import scoped, tenant_var
from trainer_client.wire import ExecuteResult

ROUTE = "/nemo/execute"
MEMORY_MB = 1024


class NemoWire:
    """`POST /execute` and `DELETE /sessions/{id}` of NeMo-Skills' sandbox."""

    def __init__(self, ctx: ApiContext) -> None:
        self._ctx = ctx

    @staticmethod
    def _session_header(scope: Scope) -> str | None:
        raw = dict(scope["headers"]).get(b"x-session-id")
        if raw is None:
            return None
        return raw.decode("latin-1") or None

    async def execute(self, scope: Scope, body: bytes, send: Send) -> None:
        """Run one NeMo-Skills request."""
        header = self._session_header(scope)
        call = nemo.parse_call(body, header, self._ctx.settings.max_timeout)
        if isinstance(call, dict):
            await send_json(send, 400, call)
            return
        if len(call.code.encode()) > self._ctx.settings.max_code_bytes:
            why = f"generated_code over {self._ctx.settings.max_code_bytes} bytes\n"
            await send_json(send, 400, nemo.answer("error", stderr=why))
            return
        session = scoped(tenant_var.get(), header) if call.stateful and header else None
        payload = JobPayload(
            code=call.code,
            stdin="" if call.stateful else call.stdin,
            timeout_s=call.timeout_s,
            memory_mb=min(MEMORY_MB, self._ctx.settings.max_memory_mb),
            session_id=session,
            request_id=request_id_var.get(),
        )
        try:
            (result,) = await self._ctx.run([payload], ROUTE)
        except Overloaded as exc:
            self._ctx.metrics.reject("queue_full", tenant_var.get().name)
            retry = [(b"retry-after", str(self._ctx.settings.retry_after_s).encode())]
            why = f"{exc}; nothing ran, retry later\n"
            await send_json(send, 429, nemo.answer("error", stderr=why), retry)
            return
        except Unavailable as exc:
            await send_json(send, 503, nemo.answer("error", stderr=f"{exc}\n"))
            return
        await send_json(send, 200, nemo.to_answer(ExecuteResult.model_validate(result), call))

    async def delete(self, session_id: str, send: Send) -> None:
        """End a session: 200, or 404 when there is none (what NeMo-Skills' client waits for)."""
        if len(session_id) > nemo.MAX_SESSION_ID_CHARS:
            await send_json(send, 404, {"error": "IPython session not found"})
            return
        session = scoped(tenant_var.get(), session_id)
        try:
            ended = await self._ctx.dispatcher.end_session(session, request_id_var.get())
        except (Overloaded, Unavailable) as exc:
            await send_json(send, 503, {"error": str(exc)})
            return
        if not ended:
            await send_json(send, 404, {"error": f"IPython session {session_id} not found"})
            return
        await send_json(send, 200, {"message": f"IPython session {session_id} deleted"})

    async def health(self, send: Send) -> None:
        """NeMo-Skills' `GET /health`: 200 once the service can run code (as /readyz)."""
        ready, reason = await self._ctx.dispatcher.readiness()
        status = 200 if ready else 503
        answer = {"status": "healthy" if ready else "unavailable", "detail": reason}
        await send_json(send, status, answer)

    async def open_instruct(self, body: bytes, send: Send) -> None:
        """open-instruct's `PythonCodeTool` call."""
        call = openinstruct.parse_call(body, self._ctx.settings.max_timeout)
        if isinstance(call, dict):
            await send_json(send, 400, call)
            return
        if len(call.code.encode()) > self._ctx.settings.max_code_bytes:
            why = f"code over {self._ctx.settings.max_code_bytes} bytes"
            await send_json(send, 400, openinstruct.answer("", why))
            return
        payload = JobPayload(
            code=call.code,
            timeout_s=call.timeout_s,
            memory_mb=min(MEMORY_MB, self._ctx.settings.max_memory_mb),
            request_id=request_id_var.get(),
        )
        try:
            (result,) = await self._ctx.run([payload], openinstruct.PATH)
        except Overloaded as exc:
            self._ctx.metrics.reject("queue_full", tenant_var.get().name)
            retry = [(b"retry-after", str(self._ctx.settings.retry_after_s).encode())]
            await send_json(send, 429, openinstruct.answer("", f"{exc}; retry later"), retry)
            return
        except Unavailable as exc:
            await send_json(send, 503, openinstruct.answer("", str(exc)))
            return
        answer = openinstruct.to_answer(ExecuteResult.model_validate(result), call)
        await send_json(send, 200, answer)
