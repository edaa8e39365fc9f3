"""A synchronous facade over SandboxClient, for trainers that are not async.

The async client runs on its own event loop in a daemon thread; calls from any number of threads
are handed to it, so concurrent callers are still micro-batched together.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from trainer_client.client import RequestLike, SandboxClient
from trainer_client.errors import ClientClosedError
from trainer_client.stats import ClientStats
from trainer_client.wire import ExecuteResult, VerifyItem, VerifyResult

if TYPE_CHECKING:
    import sys

    # typing.Self is 3.11+; the client supports 3.10 (annotations are never evaluated).
    if sys.version_info >= (3, 11):
        from typing import Self
    else:
        from typing_extensions import Self

T = TypeVar("T")


class SyncSandboxClient:
    """Blocking twin of SandboxClient; same arguments, same results and exceptions."""

    def __init__(self, base_url: str, **options: Any) -> None:
        """Start a private event loop thread and a SandboxClient on it."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rl-sandbox-client", daemon=True
        )
        self._thread.start()
        self._closed = False

        async def create() -> SandboxClient:
            return await SandboxClient(base_url, **options).__aenter__()

        self._client = self._call(create())

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def execute(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout: float = 10.0,
        memory_mb: int | None = None,
        session_id: str | None = None,
        files: Mapping[str, bytes] | None = None,
        fetch_files: Sequence[str] | None = None,
    ) -> ExecuteResult:
        """Run one program and block until its result (see SandboxClient.execute)."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        return self._call(
            self._client.execute(
                code,
                stdin=stdin,
                timeout=timeout,
                memory_mb=memory_mb,
                session_id=session_id,
                files=files,
                fetch_files=fetch_files,
            )
        )

    def execute_many(self, requests: Iterable[RequestLike]) -> list[ExecuteResult]:
        """Run many programs concurrently and block until all results, in order."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        return self._call(self._client.execute_many(list(requests)))

    def verify(
        self,
        items: Sequence[VerifyItem | tuple[str, str]],
        *,
        timeout: float = 5.0,
        rel_tol: float = 1e-6,
    ) -> list[VerifyResult]:
        """Judge (answer, reference) pairs on the service (see SandboxClient.verify)."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        return self._call(self._client.verify(list(items), timeout=timeout, rel_tol=rel_tol))

    def end_session(self, session_id: str) -> bool:
        """End a session (DELETE /sessions/{id}); False if the server did not know it."""
        return self._call(self._client.end_session(session_id))

    def stats(self) -> ClientStats:
        """A snapshot of the client-side counters."""
        return self._call(self._stats())

    async def _stats(self) -> ClientStats:
        return self._client.stats()

    def close(self) -> None:
        """Wait for outstanding calls, close the connections and stop the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._client.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
