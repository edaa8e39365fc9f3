"""A session as an object (E2B-like): `async with client.session() as s: await s.run(code)`.

A session is one persistent interpreter on the service, named by its id: the service creates it
with its first cell and `DELETE /sessions/{id}` ends it. The object only carries the id and ends
the session when its block ends, whatever way it ends, so a trajectory leaves no interpreter
behind for the server's idle TTL to reap.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from trainer_client.errors import ClientClosedError, SandboxClientError
from trainer_client.wire import ExecuteResult

if TYPE_CHECKING:
    import sys

    # typing.Self is 3.11+; the client supports 3.10 (annotations are never evaluated).
    if sys.version_info >= (3, 11):
        from typing import Self
    else:
        from typing_extensions import Self

UPLOAD_CELL = "pass"
"""The cell that carries an upload or a download: files are written before it runs and fetched
after it; it changes nothing in the interpreter."""


def new_session_id(prefix: str = "session") -> str:
    """A fresh, unguessable session id."""
    return f"{prefix}-{uuid.uuid4().hex}"


class SessionHost(Protocol):
    """What a Session needs of its client (SandboxClient has it)."""

    async def execute(
        self,
        code: str,
        *,
        stdin: str = ...,
        timeout: float = ...,
        memory_mb: int | None = ...,
        session_id: str | None = ...,
        files: Mapping[str, bytes] | None = ...,
        fetch_files: Sequence[str] | None = ...,
        seed: int | None = ...,
        group: str | None = ...,
    ) -> ExecuteResult: ...

    async def end_session(self, session_id: str) -> bool: ...

    async def fork_session(self, session_id: str, n: int) -> list[str]: ...


class Session:
    """One interpreter on the service; cells run in order and share its state."""

    def __init__(
        self,
        client: SessionHost,
        session_id: str,
        *,
        timeout: float = 10.0,
        group: str | None = None,
    ) -> None:
        """`timeout`: each cell's default wall-clock limit in seconds; `group`: every cell's."""
        self.id = session_id
        self.timeout = timeout
        self.group = group
        self._client = client
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError(f"session {self.id!r} is closed")

    async def run(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout: float | None = None,
        files: Mapping[str, bytes] | None = None,
        fetch_files: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> ExecuteResult:
        """Run one cell; its last expression is shown as in a notebook. `seed` seeds the
        interpreter's random generators at the cell's start."""
        self._check_open()
        return await self._client.execute(
            code,
            stdin=stdin,
            timeout=self.timeout if timeout is None else timeout,
            session_id=self.id,
            files=files,
            fetch_files=fetch_files,
            seed=seed,
            group=self.group,
        )

    async def fork(self, n: int) -> list[Session]:
        """`n` new sessions, each a copy of this one's state (variables, imports, files) after
        its cells so far, then independent: close each (or use it in `async with`)."""
        self._check_open()
        ids = await self._client.fork_session(self.id, n)
        return [
            Session(self._client, fork_id, timeout=self.timeout, group=self.group)
            for fork_id in ids
        ]

    async def upload(self, files: Mapping[str, bytes]) -> None:
        """Write files (relative path -> bytes) into the session's working directory."""
        result = await self.run(UPLOAD_CELL, files=files)
        if result.status != "ok":
            raise SandboxClientError(
                f"upload into session {self.id!r}: {result.status}: {result.stderr}"
            )

    async def download(self, paths: Sequence[str]) -> dict[str, bytes]:
        """The files at `paths` (relative to the working directory) that exist, as bytes."""
        result = await self.run(UPLOAD_CELL, fetch_files=paths)
        if result.status != "ok":
            raise SandboxClientError(
                f"download from session {self.id!r}: {result.status}: {result.stderr}"
            )
        return result.fetched_files()

    async def close(self) -> bool:
        """End the session on the service; False if it had no cell (or had expired)."""
        if self._closed:
            return False
        self._closed = True
        return await self._client.end_session(self.id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
