"""A group scope: calls and sessions that carry one group label, cancelled together on failure.

    async with client.group(f"step{step}/prompt{i}") as g:
        result = await g.execute(code)              # carries the group
        async with g.session() as s: ...            # every cell carries it

When the block exits with an exception (the rollout failed, or its task was cancelled because
the trainer aborted the step), the scope cancels the whole group on the service: its queued calls
never run, its running ones are killed, its sessions end. A normal exit cancels nothing.

Calls of a cancelled group answer `cancelled`. The client never re-sends them: the group was
cancelled on purpose (usually by the trainer itself), and a retry would bring back the work the
cancel removed. A rollout that meets `cancelled` (or `deadline_exceeded`) should stop and leave
its sample out of the loss (docs/rl.md), not call again under the same group.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from trainer_client.errors import SandboxClientError
from trainer_client.session import Session, new_session_id
from trainer_client.wire import ExecuteRequest, ExecuteResult, GroupCancelled

if TYPE_CHECKING:
    import sys

    from trainer_client.client import RequestLike, SandboxClient

    if sys.version_info >= (3, 11):
        from typing import Self
    else:
        from typing_extensions import Self

log = logging.getLogger(__name__)


def with_group(request: RequestLike, group: str) -> RequestLike:
    """`request` with `group` set, unless it names one of its own."""
    if isinstance(request, ExecuteRequest):
        return request if request.group is not None else request.model_copy(update={"group": group})
    fields: dict[str, Any] = dict(request)
    fields.setdefault("group", group)
    return fields


class Group:
    """The calls of one group, made through one client (see the module doc)."""

    def __init__(self, client: SandboxClient, name: str) -> None:
        self.name = name
        self._client = client
        self.cancelled: GroupCancelled | None = None
        """What the exit's cancel did (None: nothing was cancelled, or nothing was known)."""

    async def execute(self, code: str, **options: Any) -> ExecuteResult:
        """SandboxClient.execute with this group."""
        return await self._client.execute(code, group=self.name, **options)

    async def execute_many(self, requests: Iterable[RequestLike]) -> list[ExecuteResult]:
        """SandboxClient.execute_many with this group on every request."""
        return await self._client.execute_many([with_group(r, self.name) for r in requests])

    def session(self, session_id: str | None = None, *, timeout: float = 10.0) -> Session:
        """A session whose cells carry this group (cancelling the group ends it)."""
        return self._client.session(
            session_id or new_session_id(), timeout=timeout, group=self.name
        )

    async def cancel(self) -> GroupCancelled | None:
        """Cancel the group now (SandboxClient.cancel_group)."""
        return await self._client.cancel_group(self.name)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        try:
            self.cancelled = await self.cancel()
        except SandboxClientError as error:  # the block's own exception is the one to raise
            log.warning("cancelling group %r failed: %s", self.name, error)
