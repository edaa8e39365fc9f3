"""A synchronous facade over SandboxClient, for trainers that are not async.

The async client runs on its own event loop in a daemon thread; calls from any number of threads
are handed to it, so concurrent callers are still micro-batched together. A process forked from
one that used it (a reward worker) gets a loop, client and connections of its own on first use.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from trainer_client.client import RequestLike, SandboxClient
from trainer_client.errors import ClientClosedError, SandboxClientError
from trainer_client.grade_wire import GradeRequest, GradeResult
from trainer_client.group import with_group
from trainer_client.session import Session, new_session_id
from trainer_client.stats import ClientStats
from trainer_client.wire import ExecuteResult, GroupCancelled, VerifyItem, VerifyResult

if TYPE_CHECKING:
    import sys

    # typing.Self is 3.11+; the client supports 3.10 (annotations are never evaluated).
    if sys.version_info >= (3, 11):
        from typing import Self
    else:
        from typing_extensions import Self

T = TypeVar("T")
log = logging.getLogger(__name__)

_INHERITED: list[tuple[asyncio.AbstractEventLoop, threading.Thread, SandboxClient]] = []
"""What forked children inherited of their parents' clients: kept, never used or closed (the
inherited loop still counts as running, its thread does not exist; closing the client would
need that loop)."""


class SyncSandboxClient:
    """Blocking twin of SandboxClient; same arguments, same results and exceptions."""

    def __init__(self, base_url: str, **options: Any) -> None:
        """Start a private event loop thread and a SandboxClient on it."""
        self._base_url = base_url
        self._options = options
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rl-sandbox-client", daemon=True
        )
        self._thread.start()

        async def create() -> SandboxClient:
            return await SandboxClient(self._base_url, **self._options).__aenter__()

        self._client = asyncio.run_coroutine_threadsafe(create(), self._loop).result()

    def _call(self, call: Callable[[SandboxClient], Coroutine[Any, Any, T]]) -> T:
        """Run call(client) on the loop thread and wait for it."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        if os.getpid() != self._pid:
            # Threads do not survive fork: a call handed to the inherited loop would never run.
            _INHERITED.append((self._loop, self._thread, self._client))
            self._start()
        return asyncio.run_coroutine_threadsafe(call(self._client), self._loop).result()

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
        seed: int | None = None,
        group: str | None = None,
        deadline_s: float | None = None,
    ) -> ExecuteResult:
        """Run one program and block until its result (see SandboxClient.execute)."""
        return self._call(
            lambda client: client.execute(
                code,
                stdin=stdin,
                timeout=timeout,
                memory_mb=memory_mb,
                session_id=session_id,
                files=files,
                fetch_files=fetch_files,
                seed=seed,
                group=group,
                deadline_s=deadline_s,
            )
        )

    def execute_many(self, requests: Iterable[RequestLike]) -> list[ExecuteResult]:
        """Run many programs concurrently and block until all results, in order."""
        batch = list(requests)
        return self._call(lambda client: client.execute_many(batch))

    def verify(
        self,
        items: Sequence[VerifyItem | tuple[str, str]],
        *,
        timeout: float = 5.0,
        rel_tol: float = 1e-6,
    ) -> list[VerifyResult]:
        """Judge (answer, reference) pairs on the service (see SandboxClient.verify)."""
        batch = list(items)
        return self._call(lambda client: client.verify(batch, timeout=timeout, rel_tol=rel_tol))

    def grade(self, requests: Sequence[GradeRequest | dict[str, Any]]) -> list[GradeResult]:
        """Grade candidates on the service (see SandboxClient.grade)."""
        batch = list(requests)
        return self._call(lambda client: client.grade(batch))

    def end_session(self, session_id: str) -> bool:
        """End a session (DELETE /sessions/{id}); False if the server did not know it."""
        return self._call(lambda client: client.end_session(session_id))

    def fork_session(self, session_id: str, n: int) -> list[str]:
        """The ids of `n` copies of a session (see SandboxClient.fork_session)."""
        return self._call(lambda client: client.fork_session(session_id, n))

    def session(
        self, session_id: str | None = None, *, timeout: float = 10.0, group: str | None = None
    ) -> SyncSession:
        """A session object (`with client.session() as s: s.run(code)`); see SandboxClient."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        return SyncSession(self, session_id or new_session_id(), timeout=timeout, group=group)

    def cancel_group(self, group: str) -> GroupCancelled | None:
        """Cancel a group's calls and sessions (see SandboxClient.cancel_group)."""
        return self._call(lambda client: client.cancel_group(group))

    def group(self, group: str) -> SyncGroup:
        """A group scope (`with client.group(g) as g: g.execute(code)`); see SandboxClient."""
        return SyncGroup(self, group)

    def stats(self) -> ClientStats:
        """A snapshot of the client-side counters."""
        return self._call(_stats)

    def close(self) -> None:
        """Wait for outstanding calls, close the connections and stop the loop thread."""
        if self._closed:
            return
        if os.getpid() != self._pid:
            self._closed = True  # a forked child that never used it has nothing of its own
            return
        try:
            self._call(lambda client: client.aclose())
        finally:
            self._closed = True
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


async def _stats(client: SandboxClient) -> ClientStats:
    return client.stats()


class SyncSession:
    """Blocking twin of Session: `with client.session() as s: s.run(code)`."""

    def __init__(
        self,
        client: SyncSandboxClient,
        session_id: str,
        *,
        timeout: float,
        group: str | None = None,
    ) -> None:
        self.id = session_id
        self.timeout = timeout
        self.group = group
        self._client = client
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _session(self, client: SandboxClient) -> Session:
        if self._closed:
            raise ClientClosedError(f"session {self.id!r} is closed")
        # Made per call on the inner client of the moment: after a fork, the child's own.
        return Session(client, self.id, timeout=self.timeout, group=self.group)

    def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout: float | None = None,
        files: Mapping[str, bytes] | None = None,
        fetch_files: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> ExecuteResult:
        """Run one cell and block until its result (see Session.run)."""
        return self._client._call(
            lambda client: self._session(client).run(
                code,
                stdin=stdin,
                timeout=timeout,
                files=files,
                fetch_files=fetch_files,
                seed=seed,
            )
        )

    def fork(self, n: int) -> list[SyncSession]:
        """`n` new sessions, each a copy of this one's state (see Session.fork)."""
        if self._closed:
            raise ClientClosedError(f"session {self.id!r} is closed")
        ids = self._client.fork_session(self.id, n)
        return [
            SyncSession(self._client, fork_id, timeout=self.timeout, group=self.group)
            for fork_id in ids
        ]

    def upload(self, files: Mapping[str, bytes]) -> None:
        """Write files into the session's working directory (see Session.upload)."""
        self._client._call(lambda client: self._session(client).upload(files))

    def download(self, paths: Sequence[str]) -> dict[str, bytes]:
        """The files at `paths` that exist, as bytes (see Session.download)."""
        return self._client._call(lambda client: self._session(client).download(paths))

    def close(self) -> bool:
        """End the session on the service; False if it had no cell (or had expired)."""
        if self._closed:
            return False
        self._closed = True
        return self._client.end_session(self.id)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class SyncGroup:
    """Blocking twin of Group: `with client.group(g) as g: g.execute(code)`; the group is
    cancelled when the block exits with an exception (see trainer_client/group.py)."""

    def __init__(self, client: SyncSandboxClient, name: str) -> None:
        self.name = name
        self._client = client
        self.cancelled: GroupCancelled | None = None

    def execute(self, code: str, **options: Any) -> ExecuteResult:
        """SyncSandboxClient.execute with this group."""
        return self._client.execute(code, group=self.name, **options)

    def execute_many(self, requests: Iterable[RequestLike]) -> list[ExecuteResult]:
        """SyncSandboxClient.execute_many with this group on every request."""
        return self._client.execute_many([with_group(r, self.name) for r in requests])

    def session(self, session_id: str | None = None, *, timeout: float = 10.0) -> SyncSession:
        """A session whose cells carry this group."""
        return self._client.session(session_id, timeout=timeout, group=self.name)

    def cancel(self) -> GroupCancelled | None:
        """Cancel the group now."""
        return self._client.cancel_group(self.name)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        try:
            self.cancelled = self.cancel()
        except SandboxClientError as error:
            log.warning("cancelling group %r failed: %s", self.name, error)
