"""Items graded one at a time by a framework, sent to the service together.

The first item of a batch waits `wait_s` for others (or until `max_items` are pending); one
`send` then carries the batch, and each caller gets its own result (or the batch's error).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class Coalescer(Generic[Item, Result]):
    """Batches the items of one event loop into calls of `send` (its results in their order)."""

    def __init__(
        self,
        send: Callable[[list[Item]], Awaitable[Sequence[Result]]],
        max_items: int,
        wait_s: float,
    ) -> None:
        self._send = send
        self._max_items = max_items
        self._wait_s = wait_s
        self._pending: list[tuple[Item, asyncio.Future[Result]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._posts: set[asyncio.Task[None]] = set()

    async def submit(self, item: Item) -> Result:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._pending.append((item, future))
        if len(self._pending) >= self._max_items:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._wait_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = self._pending, []
        if batch:
            task = asyncio.ensure_future(self._post(batch))
            self._posts.add(task)
            task.add_done_callback(self._posts.discard)

    async def _post(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        try:
            results = await self._send([item for item, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
