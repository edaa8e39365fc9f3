"""`rl-sandbox mcp`: the MCP server of mcp_server.py on stdin/stdout, running code on a service.

A host waits for the answer to its `initialize` (the OpenAI Agents SDK 5 s by default), and the
SDK and our client take seconds to import on a busy machine. So the first line is read with the
standard library alone while a thread imports them; an `initialize` in a version the handshake
offers is answered at once (mcp_handshake.py, the SDK's own answer); then the SDK serves the
session from that first line on, and its second answer to the same request is dropped. What
the host sends meanwhile waits in the pipe. Logs go to stderr at `log_level` (WARNING unless
asked: stdio hosts show stderr as the server's noise).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

from sandbox_service.api.compat.mcp_handshake import initialize_answer


class _Loader(threading.Thread):
    """Imports the SDK's server module and our client in the background."""

    def __init__(self) -> None:
        super().__init__(name="mcp-import", daemon=True)
        self.modules: tuple[ModuleType, ModuleType] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            from sandbox_service.api.compat import mcp_server
            from trainer_client import client

            self.modules = (mcp_server, client)
        except BaseException as exc:  # re-raised in the main thread
            self.error = exc


class _Replayed:
    """The SDK's stdin: the lines already read, then the rest of the real stdin."""

    def __init__(self, first: list[str], rest: Any) -> None:
        self._first = first
        self._rest = rest

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        for line in self._first:
            yield line
        async for line in self._rest:
            yield line


class _Answered:
    """The SDK's stdout, less its answer to the request already answered."""

    def __init__(self, out: Any, answered_id: object) -> None:
        self._out = out
        self._answered_id = answered_id

    async def write(self, text: str) -> None:
        if self._answered_id is not None and self._is_answer(text):
            self._answered_id = None
            return
        await self._out.write(text)

    async def flush(self) -> None:
        await self._out.flush()

    def _is_answer(self, text: str) -> bool:
        try:
            message = json.loads(text)
        except ValueError:
            return False
        return (
            isinstance(message, dict)
            and message.get("id") == self._answered_id
            and ("result" in message or "error" in message)
        )


def run_stdio(url: str, api_key: str | None, max_timeout_s: float, log_level: str) -> int:
    """Serve MCP on stdin/stdout until stdin closes."""
    loader = _Loader()
    loader.start()
    stdin = sys.stdin.buffer
    first = stdin.readline()
    answered_id: object = None
    if first:
        with contextlib.suppress(ValueError):
            fast = initialize_answer(json.loads(first))
            if fast is not None:
                answered_id, line = fast
                sys.stdout.buffer.write(line.encode() + b"\n")
                sys.stdout.buffer.flush()
    loader.join()
    if loader.error is not None:
        raise loader.error
    assert loader.modules is not None
    mcp_server, client_module = loader.modules
    if not first:
        return 0

    async def main() -> None:
        import anyio
        from mcp.server.stdio import stdio_server

        rest = anyio.wrap_file(io.TextIOWrapper(stdin, encoding="utf-8", errors="replace"))
        out = anyio.wrap_file(io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8"))
        replayed = _Replayed([first.decode("utf-8", errors="replace")], rest)
        async with client_module.SandboxClient(
            url, api_key=api_key, server_max_timeout_s=max_timeout_s
        ) as client:

            async def run(code: str, session: str | None, timeout_s: float, tenant: str) -> Any:
                return await client.execute(code, timeout=timeout_s, session_id=session)

            session = mcp_server.session_name(uuid.uuid4().hex)
            server = mcp_server.build_server(run, max_timeout_s, session, log_level)
            lowlevel = server._lowlevel_server  # the SDK's own run_stdio_async does this
            try:
                async with stdio_server(replayed, _Answered(out, answered_id)) as (reader, writer):  # type: ignore[arg-type]
                    await lowlevel.run(reader, writer, lowlevel.create_initialization_options())
            finally:  # stdin closed: the one client is gone
                with contextlib.suppress(Exception):
                    await client.end_session(session)

    asyncio.run(main())
    return 0
