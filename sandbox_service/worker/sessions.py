"""The session cells of one worker: its live interpreters (SessionPool) kept in step with Redis.

Before a cell the worker asks Redis how many cells the session has recorded (`n`). If its own
interpreter has seen exactly those, the cell runs there; otherwise (a new session, one evicted or
expired here, one that moved away and back, or whose owner died) the interpreter is rebuilt by
replaying the recorded cells, output discarded, and the result says `restored`. After a cell whose
interpreter survived, the cell is appended; a cell that timed out or crashed its interpreter is
not recorded, and the next cell replays the ones before it. A thread ends idle sessions.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

import redis

from sandbox_service.broker.jobqueue import TENANTS_REFRESH_S
from sandbox_service.broker.session_store import SessionStore
from sandbox_service.cancel import Cancel
from sandbox_service.execution import ExecutionResult, ExecutionSpec, RecordedCell, Status
from sandbox_service.jail.sessions import InterpreterGone, SessionPool
from sandbox_service.jail.zygote_jail import JailFailure
from sandbox_service.logs import fields
from sandbox_service.settings import Settings
from sandbox_service.worker.tally import Tally

log = logging.getLogger(__name__)

INTERPRETER_LOST_NOTE = (
    "\n[rl-sandbox] this cell ended the session's interpreter ({status}); its state is rebuilt "
    "from the session's earlier cells (replayed, output discarded) before the next cell, whose "
    "result then says restored: true\n"
)
"""Appended to stderr of a cell after which the session's interpreter is gone."""


class SessionRunner:
    """Runs session cells for one worker slot (thread-safe; one cell at a time)."""

    def __init__(
        self,
        settings: Settings,
        slot: int,
        store: SessionStore,
        worker: str,
        spares: int = 1,
        tally: Tally | None = None,
    ) -> None:
        self._pool = SessionPool(settings, slot, spares=spares)
        self._tally = tally or Tally()
        self._store = store
        self._worker = worker
        self._seen: dict[str, int] = {}
        """Session id -> recorded cells its live interpreter here has run."""
        self._lock = threading.Lock()
        self._weights_read_at = -TENANTS_REFRESH_S
        self._stop = threading.Event()
        self._interval_s = max(0.2, min(settings.session_ttl_s / 4, 10.0))
        self._expiry = threading.Thread(target=self._expire_loop, name="sessions", daemon=True)

    def start(self) -> None:
        """Start ending idle sessions in the background."""
        self._expiry.start()

    @property
    def live_count(self) -> int:
        """Sessions whose interpreter lives here now."""
        return self._pool.live_count

    def run_cell(
        self, session_id: str, spec: ExecutionSpec, cancel: Cancel | None = None
    ) -> tuple[ExecutionResult, bool]:
        """Run one cell; (result, restored). Failures of Redis or the jail are results too."""
        with self._lock:
            try:
                return self._run_cell(session_id, spec, cancel)
            except redis.RedisError as exc:
                # The cell may have run without being recorded: drop the interpreter, so that
                # the session's state stays what Redis says (a retry of the cell is then safe).
                self._drop(session_id)
                log.warning("session store unavailable", extra=fields(error=str(exc)))
                message = f"session store unavailable: {exc}"
                return ExecutionResult.failure(Status.SANDBOX_ERROR, message), False

    def _refresh_weights(self) -> None:
        """Share the pool by the tenants' published weights (re-read every few seconds)."""
        now = time.monotonic()
        if now - self._weights_read_at >= TENANTS_REFRESH_S:
            self._weights_read_at = now
            self._pool.set_weights(self._store.tenant_weights())

    def _run_cell(
        self, session_id: str, spec: ExecutionSpec, cancel: Cancel | None
    ) -> tuple[ExecutionResult, bool]:
        self._refresh_weights()
        seen = self._seen.get(session_id, -1)
        if self._pool.is_live(session_id) != (seen >= 0):
            self._drop(session_id)
            seen = -1
        state = self._store.state(session_id, seen)
        if seen >= 0 and state.n != seen:
            self._drop(session_id)  # deleted, expired or continued elsewhere meanwhile
        try:
            outcome = self._pool.run_cell(session_id, spec, state.history or (), cancel)
        except InterpreterGone:  # a forked interpreter ended between its cells: rebuild it
            self._seen.pop(session_id, None)
            state = self._store.state(session_id, -1)
            outcome = self._pool.run_cell(session_id, spec, state.history or (), cancel)
        self._forget_evicted(outcome.evicted)
        result = outcome.result
        if outcome.alive:
            n = self._store.record(session_id, state.n, self._worker, RecordedCell.of(spec))
            if n < 0:
                self._drop(session_id)  # the session was deleted or moved on while the cell ran
            else:
                self._seen[session_id] = n
        else:
            self._seen.pop(session_id, None)
            self._store.record(session_id, state.n, self._worker, None)
            if result.status != Status.SANDBOX_ERROR:
                note = INTERPRETER_LOST_NOTE.format(status=result.status)
                result = replace(result, stderr=result.stderr + note)
        return result, outcome.restored

    def _forget_evicted(self, evicted: Sequence[str]) -> None:
        if evicted:
            for session_id in evicted:
                self._seen.pop(session_id, None)
            self._store.release(evicted, self._worker)
            self._tally.sessions_ended("evicted", len(evicted))
            log.info("sessions evicted", extra=fields(sessions=list(evicted)))

    def end(self, session_id: str) -> bool:
        """End a session here and forget it in Redis; whether it existed."""
        with self._lock:
            was_live = self._drop(session_id)
            ended = self._store.forget(session_id) or was_live
            self._tally.sessions_ended("deleted", int(ended))
            return ended

    def fork(self, session_id: str, forks: tuple[str, ...]) -> bool:
        """Make `forks` copies of the session as it is now (behind its earlier cells, which ran
        on this worker first); whether the session existed.

        The records are copied in Redis in any case. When the session's interpreter lives
        here and is at its records' state, it is forked too (copy-on-write, in its jail): the
        forks are live here and owned by this worker; otherwise (or if that fork fails) each
        fork's first cell rebuilds it from the copied records, wherever it runs.
        """
        with self._lock:
            seen = self._seen.get(session_id, -1)
            state = self._store.state(session_id, seen)
            if state.n < 0:
                return False
            live = seen >= 0 and state.n == seen and self._pool.is_live(session_id)
            if live:
                self._refresh_weights()
                try:
                    evicted = self._pool.fork(session_id, forks)
                except JailFailure as exc:
                    log.warning("live fork failed", extra=fields(error=str(exc)))
                    live = False
                    for fork_id in forks:
                        self._pool.end(fork_id)
                else:
                    self._forget_evicted(evicted)
            n = self._store.fork(session_id, forks, self._worker if live else None)
            for fork_id in forks:
                if live and n == seen:
                    self._seen[fork_id] = n
                else:
                    self._drop(fork_id)
            return n >= 0

    def abandon(self, session_id: str) -> None:
        """The cell overran its job budget: kill the session's jail."""
        with self._lock:
            self._seen.pop(session_id, None)
            self._pool.end(session_id, force=True)

    def _drop(self, session_id: str) -> bool:
        self._seen.pop(session_id, None)
        return self._pool.end(session_id)

    def _expire_loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                with self._lock:
                    expired = self._pool.expire_idle()
                    for session_id in expired:
                        self._seen.pop(session_id, None)
                if expired:
                    self._tally.sessions_ended("expired", len(expired))
                    log.info("sessions expired", extra=fields(sessions=expired))
                    self._store.release(expired, self._worker)
            except Exception:
                log.exception("expiring idle sessions failed")

    def close(self) -> None:
        """Stop the expiry thread and end every live session (Redis keeps their cells)."""
        self._stop.set()
        if self._expiry.is_alive():
            self._expiry.join(timeout=5)
        with self._lock:
            self._seen.clear()
            self._pool.close()
