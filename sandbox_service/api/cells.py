"""Several cells behind one API: each cell is one Redis with its own workers, and one Dispatcher.

Built only when `cells` names more Redis URLs (create_app); with one cell the API uses its
Dispatcher directly and nothing here runs.

- Stateless calls go whole to the cell with the least load per live worker (this process's
  calls in flight there over its live workers, both known here: no Redis round trip per call).
- A session lives in one cell: a deterministic hash of its tenant-scoped id over the cells
  (session_cell). Its cells, its ending, its forks (whose ids are drawn to hash to the same
  cell, fork_routes.py) and its /run_jupyter go there. No state is shared between cells: while a
  cell's Redis is down its sessions are unavailable (503 / sandbox_error).
- A request whose calls fall in several cells (sessions of several cells) is split per cell:
  each part is admitted whole or not at all, not the request as one.
- A group cancel goes to every cell (the counts summed).
- A probe task reads each cell's live workers once a second: a cell whose Redis fails the probe
  (or an admission) takes no new stateless calls until a probe sees it back. Its calls in flight
  are answered as on a single cell when its Redis is lost (sandbox_error, or 503 at admission).
- Quotas (queue bound, a tenant's in-flight and session quotas) hold per cell.
- The E2B wire keeps its sandbox records in the first cell (their sessions are pinned as above).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from sandbox_service.api.dispatch import Dispatcher, GroupCancel, Unavailable
from sandbox_service.broker.worker_stats import WorkerStats
from sandbox_service.jobs import JobPayload, ResultDict
from sandbox_service.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

PROBE_INTERVAL_S = 1.0
"""How often each cell's Redis and live workers are read."""
PROBE_TIMEOUT_S = 2.0
CELL_LOST_AFTER_S = 5.0
"""A cell whose Redis fails the probes this long has its calls in flight answered sandbox_error
(retryable: a retry goes to a cell up). A single cell waits for its Redis instead, as nowhere
else could run them; a shorter blip is survived the same way here."""


def session_cell(session_id: str, cells: int) -> int:
    """The cell of a session (its tenant-scoped id): the same in every API process."""
    digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % cells


def least_loaded(in_flight: Sequence[int], workers: Sequence[int], up: Sequence[bool]) -> int:
    """The cell for stateless work: among the cells up with live workers, the one with the fewest
    calls in flight per worker (the first on ties); with none such, the first cell up, else 0."""
    best, best_load = -1, 0.0
    for cell, (calls, alive, ok) in enumerate(zip(in_flight, workers, up, strict=True)):
        if ok and alive > 0:
            load = (calls + 1) / alive
            if best < 0 or load < best_load:
                best, best_load = cell, load
    if best >= 0:
        return best
    return next((cell for cell, ok in enumerate(up) if ok), 0)


class Cells:
    """The Dispatcher's surface over several cells (one Dispatcher each)."""

    def __init__(self, settings: Settings) -> None:
        urls = settings.cell_urls()
        if len(urls) < 2:
            raise ValueError("Cells needs redis_url and at least one more URL in cells")
        self.settings = settings
        self.cells = [
            Dispatcher(settings.model_copy(update={"redis_url": url, "cells": ""})) for url in urls
        ]
        self._up = [True] * len(urls)
        self._workers = [0] * len(urls)
        self._why = [""] * len(urls)
        self._down_since = [0.0] * len(urls)
        self._draining = False
        self._probe: asyncio.Task[None] | None = None

    # --- what the routes read ---

    @property
    def api_id(self) -> str:
        return self.cells[0].api_id

    @property
    def redis(self) -> aioredis.Redis:
        """The first cell's Redis (the E2B wire's sandbox records)."""
        return self.cells[0].redis

    @property
    def draining(self) -> bool:
        return self._draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self._draining = value
        for cell in self.cells:
            cell.draining = value

    @property
    def in_flight(self) -> int:
        return sum(cell.in_flight for cell in self.cells)

    @property
    def retries(self) -> int:
        return sum(cell.retries for cell in self.cells)

    def same_cell(self, session_id: str, other: str) -> bool:
        """Whether two sessions (tenant-scoped ids) live in the same cell."""
        n = len(self.cells)
        return session_cell(session_id, n) == session_cell(other, n)

    # --- lifecycle ---

    async def start(self) -> None:
        for cell in self.cells:
            await cell.start()
        await self._probe_all()
        self._probe = asyncio.create_task(self._probe_loop(), name="cells-probe")

    async def stop(self) -> None:
        self.draining = True
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await asyncio.gather(*(cell.stop() for cell in self.cells))

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            await self._probe_all()

    async def _probe_all(self) -> None:
        await asyncio.gather(*(self._probe_one(i) for i in range(len(self.cells))))

    async def _probe_one(self, i: int) -> None:
        try:
            workers = await asyncio.wait_for(self.cells[i].live_workers(), PROBE_TIMEOUT_S)
        except (RedisError, OSError, TimeoutError) as exc:
            now = time.monotonic()
            if self._up[i] or not self._down_since[i]:
                log.warning("cell %d down: %s", i, exc)
                self._down_since[i] = now
            self._up[i], self._why[i] = False, f"redis unreachable: {exc or type(exc).__name__}"
            lost = self.cells[i]
            if now - self._down_since[i] >= CELL_LOST_AFTER_S and lost.in_flight:
                log.warning("cell %d lost: answering its %d calls in flight", i, lost.in_flight)
                lost.awaiter.fail_all(f"cell {i} lost its Redis; retry")
            return
        if not self._up[i]:
            log.info("cell %d back", i)
        self._up[i], self._workers[i], self._down_since[i] = True, workers, 0.0
        self._why[i] = "" if workers else "no live worker"

    # --- execution ---

    def _cell_of(self, payload: JobPayload, stateless: int) -> int:
        if payload.session_id is None:
            return stateless
        return session_cell(payload.session_id, len(self.cells))

    async def submit(self, payloads: Sequence[JobPayload]) -> list[ResultDict]:
        """Run the payloads in their cells; each cell's part admitted whole or not at all."""
        if self._draining:
            raise Unavailable("the server is shutting down")
        stateless = least_loaded([cell.in_flight for cell in self.cells], self._workers, self._up)
        parts: dict[int, list[int]] = {}
        for index, payload in enumerate(payloads):
            parts.setdefault(self._cell_of(payload, stateless), []).append(index)
        if len(parts) == 1:
            (cell,) = parts
            try:
                return await self._submit_in(cell, payloads)
            except Unavailable:
                # Stateless work refused by a cell whose Redis failed: once more on another.
                # (Stateless calls are at least once already: a Redis restart resubmits them.)
                retry = least_loaded([c.in_flight for c in self.cells], self._workers, self._up)
                if (
                    any(p.session_id is not None for p in payloads)
                    or retry == cell
                    or not self._up[retry]
                    or self._draining
                ):
                    raise
                return await self._submit_in(retry, payloads)
        tasks = [
            asyncio.ensure_future(self._submit_in(cell, [payloads[i] for i in indices]))
            for cell, indices in parts.items()
        ]
        try:
            answers = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # the other parts' calls are abandoned, as a client gone
                task.cancel()
            raise
        results: list[ResultDict | None] = [None] * len(payloads)
        for indices, answer in zip(parts.values(), answers, strict=True):
            for i, result in zip(indices, answer, strict=True):
                results[i] = result
        return [result for result in results if result is not None]

    async def _submit_in(self, cell: int, payloads: Sequence[JobPayload]) -> list[ResultDict]:
        try:
            return await self.cells[cell].submit(payloads)
        except Unavailable as exc:
            if not self._draining and "redis" in str(exc):
                self._up[cell], self._why[cell] = False, str(exc)  # until a probe sees it back
                self._down_since[cell] = self._down_since[cell] or time.monotonic()
            raise

    def _session_dispatcher(self, session_id: str) -> Dispatcher:
        return self.cells[session_cell(session_id, len(self.cells))]

    async def end_session(self, session_id: str, request_id: str = "") -> bool:
        return await self._session_dispatcher(session_id).end_session(session_id, request_id)

    async def session_ended(self, session_id: str) -> None:
        await self._session_dispatcher(session_id).session_ended(session_id)

    async def sessions_ended(self, session_ids: Sequence[str]) -> None:
        for session_id in session_ids:
            await self.session_ended(session_id)

    async def fork_session(
        self, session_id: str, forks: Sequence[str], request_id: str = ""
    ) -> bool | None:
        if not all(self.same_cell(session_id, fork) for fork in forks):
            raise ValueError("a fork's id must hash to its parent's cell")
        return await self._session_dispatcher(session_id).fork_session(
            session_id, forks, request_id
        )

    async def cancel_group(self, group_id: str, request_id: str = "") -> GroupCancel | None:
        """Cancel the group in every cell (the counts summed); a cell down is skipped while
        another answers."""
        answers = await asyncio.gather(
            *(cell.cancel_group(group_id, request_id) for cell in self.cells),
            return_exceptions=True,
        )
        failures = [a for a in answers if isinstance(a, BaseException)]
        if len(failures) == len(answers):
            raise failures[0]
        done = [a for a in answers if isinstance(a, GroupCancel)]
        if not done:
            return None
        return GroupCancel(sum(a.cancelled for a in done), sum(a.sessions for a in done))

    # --- operations ---

    async def readiness(self) -> tuple[bool, str]:
        """Ready while one cell is; the reason names the cells down."""
        if self._draining:
            return False, "the server is shutting down"
        answers = await asyncio.gather(*(cell.readiness() for cell in self.cells))
        ready = [i for i, (ok, _) in enumerate(answers) if ok]
        down = "; ".join(f"cell {i} down: {why}" for i, (ok, why) in enumerate(answers) if not ok)
        workers = sum(self._workers[i] for i in ready)
        if not ready:
            return False, down
        summary = f"{len(ready)} of {len(self.cells)} cells ready, {workers} live workers"
        return True, f"{summary}; {down}" if down else summary

    async def live_workers(self) -> int:
        counts = await self._each(lambda cell: cell.live_workers())
        return sum(counts)

    async def queue_depth(self) -> int:
        depths = await self._each(lambda cell: cell.queue_depth())
        return sum(depths)

    async def recorded_bytes(self) -> dict[str, int]:
        """Each tenant's recorded session bytes, summed over the cells up."""
        parts = await self._each(lambda cell: cell.recorded_bytes())
        total: dict[str, int] = {}
        for part in parts:
            for tenant, size in part.items():
                total[tenant] = total.get(tenant, 0) + size
        return total

    async def worker_stats(self) -> dict[str, WorkerStats]:
        stats = await self._each(lambda cell: cell.worker_stats())
        merged: dict[str, WorkerStats] = {}
        for part in stats:
            merged.update(part)
        return merged

    async def _each(self, read: Callable[[Dispatcher], Awaitable[T]]) -> list[T]:
        """`read` of every cell up; Redis errors only when every cell fails."""
        answers = await asyncio.gather(*(read(cell) for cell in self.cells), return_exceptions=True)
        good: list[T] = [a for a in answers if not isinstance(a, BaseException)]
        if not good and isinstance(answers[0], BaseException):
            raise answers[0]
        return good
