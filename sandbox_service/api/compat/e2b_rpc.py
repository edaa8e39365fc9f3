"""envd's Connect RPC of an E2B sandbox (ASGI I/O of e2b_envd.py): the filesystem's unary calls
and the process service (`commands`), each a cell of the sandbox's session.

A command is a process of the sandbox's jail (the program's uid, its limits, no network) that
outlives the cell that started it: E2B's cells keep the processes they leave (`keep_processes`),
so a command, like a server a cell starts, runs until it ends, is killed, or the sandbox ends.
Its output goes to files in the jail's /tmp; a stream (`Start`, `Connect`) reads them with short
cells (`poll`, e2b_inside.py), each waiting up to POLL_WAIT_S for the command to end or print,
so other calls of the sandbox take their turns in between. The pid is the command's own in the
jail.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import signal
import time
from typing import Any

from redis.exceptions import RedisError
from starlette.types import Receive, Send

from sandbox_service.api.compat import e2b_envd as envd
from sandbox_service.api.compat.asgi_io import disconnected, read_body, send_bytes, send_json
from sandbox_service.api.compat.e2b import SandboxRecord
from sandbox_service.api.compat.e2b_envd import RpcError
from sandbox_service.api.compat.e2b_sandbox import SandboxPlane
from sandbox_service.api.dispatch import Overloaded, Unavailable
from trainer_client.wire import ExecuteResult

log = logging.getLogger(__name__)

STREAM_TYPE = b"application/connect+json"
POLL_WAIT_S = 1.0
"""Longest a poll cell waits for its command to end or print (the sandbox's other calls wait)."""
FIRST_WAIT_S = 0.5
"""The start cell waits this long for the command, so a short one is answered in one cell."""
CELL_MARGIN_S = 5.0
DEADLINE_LEAD_S = 0.25
SIGNALS = {"SIGNAL_SIGKILL": signal.SIGKILL, "SIGNAL_SIGTERM": signal.SIGTERM}


async def _send_error(send: Send, error: RpcError) -> None:
    await send_bytes(send, error.status(), error.body())


def _unanswered(result: ExecuteResult) -> RpcError:
    """Why a call got no answer from the sandbox's interpreter."""
    if result.status == "error":  # the sandbox's own code broke what the call runs with
        last = (result.stderr.strip().splitlines() or ["no answer"])[-1]
        return RpcError("failed_precondition", f"the sandbox could not run the call: {last}")
    why = f"the sandbox's interpreter ended before it answered ({result.status}); try again"
    return RpcError("unavailable", why)


class EnvdRpc:
    """envd's Connect services over the sandbox's session."""

    def __init__(self, plane: SandboxPlane, max_output_bytes: int) -> None:
        self._plane = plane
        # A poll's answer is both streams' bytes in base64 in one JSON line of the cell's stdout.
        self._chunk_bytes = max(1024, (max_output_bytes - 4096) * 3 // 8)
        self._detached: set[asyncio.Task[tuple[dict[str, Any] | None, ExecuteResult]]] = set()

    async def serve(
        self,
        method: str,
        path: str,
        headers: dict[bytes, bytes],
        receive: Receive,
        send: Send,
        record: SandboxRecord,
    ) -> None:
        """`POST /<service>/<method>` of envd."""
        service, _, name = path.strip("/").partition("/")
        if method != "POST":
            await _send_error(send, RpcError("unimplemented", f"{method} {path} is not served"))
            return
        body = await read_body(receive)
        try:
            if service == envd.PROCESS and name in ("Start", "Connect"):
                deadline = _deadline_s(headers)
                await self._stream(name, body, deadline, receive, send, record)
                return
            message = envd.json_message(body)
            if isinstance(message, RpcError):
                args: dict[str, Any] | RpcError = message
            elif service == envd.FILESYSTEM:
                args = envd.filesystem_op(name, message)
            elif service == envd.PROCESS:
                args = self._process_op(name, message)
            else:
                args = RpcError("unimplemented", f"{path} is not served")
            if isinstance(args, RpcError):
                await _send_error(send, args)
                return
            answer = await self._op(record, args)
            if isinstance(answer, RpcError):
                await _send_error(send, answer)
            else:
                await send_json(send, 200, answer)
        except Overloaded as exc:
            await _send_error(send, RpcError("resource_exhausted", f"{exc}; retry later"))
        except (Unavailable, RedisError, OSError) as exc:
            await _send_error(send, RpcError("unavailable", str(exc)))

    async def _op(
        self, record: SandboxRecord, args: dict[str, Any], timeout_s: float | None = None
    ) -> dict[str, Any] | RpcError:
        """One e2b_inside.py op's answer, or its error. A client that leaves does not cancel
        the op's cell: a cancelled cell ends the sandbox's interpreter, and with it the
        sandbox's commands (envd's calls are short, a poll ends within POLL_WAIT_S)."""
        running = asyncio.create_task(self._plane.op(record, args, timeout_s))
        self._detached.add(running)
        running.add_done_callback(self._detached.discard)
        answer, result = await asyncio.shield(running)
        if answer is None:
            return _unanswered(result)
        error = envd.answer_error(answer)
        return answer if error is None else error

    def _process_op(self, name: str, message: dict[str, Any]) -> dict[str, Any] | RpcError:
        """The e2b_inside.py arguments of a unary process call."""
        if name == "List":
            return {"op": "processes"}
        if name not in ("SendSignal", "SendInput", "CloseStdin"):
            return RpcError("unimplemented", f"process.Process/{name} is not served")
        pid = envd.pid_of(message)
        if isinstance(pid, RpcError):
            return pid
        if name == "SendSignal":
            number = SIGNALS.get(str(message.get("signal")), signal.SIGKILL)
            return {"op": "signal", "pid": pid, "signal": int(number)}
        if name == "CloseStdin":
            return {"op": "stdin", "pid": pid, "data": None}
        given = message.get("input")
        data = given.get("stdin", given.get("pty")) if isinstance(given, dict) else None
        if not isinstance(data, str):
            return RpcError("invalid_argument", "input.stdin must be base64 bytes")
        try:
            base64.b64decode(data, validate=True)
        except ValueError:
            return RpcError("invalid_argument", "input.stdin must be base64 bytes")
        return {"op": "stdin", "pid": pid, "data": data}

    # --- streams -------------------------------------------------------------------------------

    async def _stream(
        self,
        name: str,
        body: bytes,
        deadline_s: float | None,
        receive: Receive,
        send: Send,
        record: SandboxRecord,
    ) -> None:
        started = time.monotonic()
        message = envd.first_message(body)
        if isinstance(message, RpcError):
            await _stream_refused(send, message)
            return
        if name == "Connect":
            pid = envd.pid_of(message)
            if isinstance(pid, RpcError):
                await _stream_refused(send, pid)
                return
            first = await self._op(record, self._poll(pid, -1, -1, 0.0))
        else:
            command = envd.parse_start(message)
            if isinstance(command, RpcError):
                await _stream_refused(send, command)
                return
            spawn = {
                "op": "spawn",
                "cmd": command.script(),
                "cwd": command.cwd,
                "envs": {**record.env_vars, **command.envs},
                "stdin": message.get("stdin") is True,
                "info": command.info(0),
                "wait": FIRST_WAIT_S,
                "max_bytes": self._chunk_bytes,
            }
            first = await self._op(record, spawn)
        if isinstance(first, RpcError):
            await _stream_refused(send, first)
            return
        # Ended just before the client's deadline, so that the client reads envd's answer.
        ends_at = None if not deadline_s else started + deadline_s - DEADLINE_LEAD_S
        await self._answer_stream(record, first, ends_at, receive, send)

    def _poll(self, pid: int, out_at: int, err_at: int, wait_s: float) -> dict[str, Any]:
        return {
            "op": "poll",
            "pid": pid,
            "outAt": out_at,
            "errAt": err_at,
            "wait": wait_s,
            "max_bytes": self._chunk_bytes,
        }

    async def _answer_stream(
        self,
        record: SandboxRecord,
        polled: dict[str, Any],
        ends_at: float | None,
        receive: Receive,
        send: Send,
    ) -> None:
        """Stream a command's events: start, its output as it comes, its end. A client that
        leaves, or whose deadline passes, stops the stream, not the command (as envd's)."""
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", STREAM_TYPE)],
            }
        )
        more = {"type": "http.response.body", "more_body": True}
        pid = int(polled["pid"])
        await send({**more, "body": envd.envelope(envd.start_event(pid))})
        left = asyncio.create_task(disconnected(receive))
        try:
            while True:
                events = _output_events(polled)
                if events:
                    await send({**more, "body": b"".join(map(envd.envelope, events))})
                code = polled.get("exitCode")
                if isinstance(code, int) and not polled.get("more"):
                    await send({"type": "http.response.body", "body": _ended(code)})
                    return
                wait = 0.0 if polled.get("more") else POLL_WAIT_S
                if ends_at is not None:
                    wait = min(wait, ends_at - time.monotonic())
                if wait < 0:
                    why = "the command's stream passed its timeout; the command still runs"
                    body = envd.end_stream(RpcError("deadline_exceeded", why))
                    await send({"type": "http.response.body", "body": body})
                    return
                at = (int(polled["outAt"]), int(polled["errAt"]))
                polling = asyncio.create_task(
                    self._op(record, self._poll(pid, *at, wait), wait + CELL_MARGIN_S)
                )
                done, _ = await asyncio.wait({polling, left}, return_when=asyncio.FIRST_COMPLETED)
                if left in done:
                    polling.cancel()
                    return
                answer = polling.result()
                if isinstance(answer, RpcError):
                    await send({"type": "http.response.body", "body": envd.end_stream(answer)})
                    return
                polled = answer
        except (Overloaded, Unavailable, RedisError, OSError) as exc:
            error = RpcError("unavailable", f"the command's output could not be read: {exc}")
            await send({"type": "http.response.body", "body": envd.end_stream(error)})
        finally:
            left.cancel()


def _output_events(polled: dict[str, Any]) -> list[dict[str, Any]]:
    """The data events of one poll's answer (its bytes, base64 as the wire carries them)."""
    events = []
    for stream, key in (("stdout", "out"), ("stderr", "err")):
        data = polled.get(key)
        if isinstance(data, str) and data:
            events.append({"event": {"data": {stream: data}}})
    return events


def _ended(code: int) -> bytes:
    """The end event and the end of the stream: envd's exit code, -1 for a signal."""
    if code >= 0:
        end = envd.end_event(code)
    else:
        name = signal.Signals(-code).name[3:].lower() if -code in signal.valid_signals() else ""
        end = envd.end_event(-1, f"signal: {name or -code}")
    return envd.envelope(end) + envd.end_stream()


async def _stream_refused(send: Send, error: RpcError) -> None:
    """A streaming call refused before it started: Connect's error in the end of the stream."""
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", STREAM_TYPE)]}
    )
    await send({"type": "http.response.body", "body": envd.end_stream(error)})


def _deadline_s(headers: dict[bytes, bytes]) -> float | None:
    """The client's deadline of a call (Connect's `Connect-Timeout-Ms`), in seconds."""
    raw = headers.get(b"connect-timeout-ms", b"")
    with contextlib.suppress(ValueError):
        if raw.isdigit() and len(raw) <= 12:
            return int(raw) / 1000
    return None
