"""Live sessions of one worker: each a persistent interpreter in its own warm jail.

A session's jail is a preloaded zygote in session mode (its interpreter is forked from the warm
zygote and keeps its namespace across cells). Jails are started ahead of need (spares), so a new
session does not wait for the preload. The pool is bounded and shared by tenant weight
(session_shares.py: a tenant's new session evicts its own least recently used, never another
tenant's within its share) and idle sessions expire. A session that is not live here (new,
evicted, or held by a worker that died) is rebuilt by replaying its recorded cells with their
output discarded.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from sandbox_service.cancel import Cancel
from sandbox_service.execution import ExecutionResult, ExecutionSpec, RecordedCell, Status
from sandbox_service.jail.cgroups import SlotCgroups
from sandbox_service.jail.executor import apply_cpu_limit, fetch_budget, make_layout, to_result
from sandbox_service.jail.inside.protocol import INTERPRETER_GONE
from sandbox_service.jail.zygote_jail import JailFailure, LimitNotRestored, ZygoteJail
from sandbox_service.session_shares import evictions, share
from sandbox_service.settings import Settings
from sandbox_service.tenancy import tenant_of

log = logging.getLogger(__name__)

# Session jails use their own range of outside uids, apart from the executor slots'.
SESSION_UID_OFFSET = 10000
SESSION_UIDS_PER_SLOT = 1000


MEMORY_NOT_RESTORED = (
    "rl-sandbox: the session's interpreters hold more memory than this cell's limit "
    "(memory_mb); the session ended and this cell did not run\n"
)


class ReplayDiverged(Exception):
    """A recorded cell ended the session's interpreter when it was replayed (JailFailure, a
    failure of the jail itself, is not this)."""


@dataclass(frozen=True, slots=True)
class CellOutcome:
    """The result of one cell and what happened to its session."""

    result: ExecutionResult
    restored: bool
    """The session was rebuilt from its recorded cells before this cell ran."""
    alive: bool
    """The interpreter survived the cell; False: it timed out or crashed and was discarded."""
    evicted: tuple[str, ...] = ()
    """Sessions evicted to make room for this one (its tenant's least recently used)."""


class InterpreterGone(Exception):
    """A forked session's interpreter is no longer in its jail: rebuild it from its records."""


@dataclass
class _LiveSession:
    jail: ZygoteJail
    cgroups: SlotCgroups
    last_used: float = field(default_factory=time.monotonic)
    member: int = 0
    """Its interpreter in the jail (0: the jail's first; others are forks)."""
    family: set[str] | None = None
    """The sessions sharing this jail (a forked session and its forks); None: alone."""


class SessionPool:
    """The live sessions of one worker slot."""

    def __init__(self, settings: Settings, slot: int, spares: int = 1) -> None:
        self._settings = settings
        self._slot = slot
        self._spares_wanted = spares
        self._live: OrderedDict[str, _LiveSession] = OrderedDict()
        self._spares: list[_LiveSession] = []
        self._lock = threading.Condition()
        self._starting = 0
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._serial = itertools.count()
        self._weights: dict[str, float] = {}
        base = make_layout(settings, slot, "warm")
        self._layout = replace(base, session=True, preload=True, once=False, time_limit_s=0)
        self._log_path = Path(f"/tmp/rl-sandbox-session-{os.getpid()}-{slot}.log")

    # --- jails ---------------------------------------------------------------------------------

    def _start_session_jail(self, preload: bool = True) -> _LiveSession:
        serial = next(self._serial)
        uid = (
            self._settings.sandbox_uid_base
            + SESSION_UID_OFFSET
            + self._slot * SESSION_UIDS_PER_SLOT
            + serial % SESSION_UIDS_PER_SLOT
        )
        cgroups = SlotCgroups(
            self._settings.cgroup_parent,
            f"session{self._slot}x{serial}-{os.getpid()}",
            whole_life=True,
        )
        cgroups.create()
        apply_cpu_limit(cgroups, self._settings.slot_cpu_cores)
        layout = replace(self._layout, outside_uid=uid, preload=preload)
        jail = ZygoteJail(layout, cgroups, self._log_path, fetch_budget(self._settings))
        try:
            jail.start()
        except JailFailure:
            cgroups.destroy()
            raise
        return _LiveSession(jail=jail, cgroups=cgroups)

    def _refill_spares(self) -> None:
        with self._lock:
            missing = self._spares_wanted - len(self._spares) - self._starting
            self._starting += max(missing, 0)
        for _ in range(max(missing, 0)):
            thread = threading.Thread(target=self._start_spare, daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _start_spare(self) -> None:
        try:
            spare = self._start_session_jail()
        except (JailFailure, OSError) as exc:
            log.warning("could not start a spare session jail", extra={"error": str(exc)})
            spare = None
        with self._lock:
            self._starting -= 1
            keep = spare is not None and not self._closed
            if keep and spare is not None:
                self._spares.append(spare)
            self._lock.notify_all()
        if spare is not None and not keep:
            self._discard(spare)  # the pool was closed while this spare started

    def _take_jail(self) -> _LiveSession:
        with self._lock:
            spare = self._spares.pop() if self._spares else None
        session = spare if spare is not None and spare.jail.alive() else None
        if spare is not None and session is None:
            self._discard(spare)
        if session is None:
            # No preloaded spare is ready. A bare jail starts in tens of milliseconds, where a
            # preload takes a second or more of CPU: this session pays its own first imports.
            session = self._start_session_jail(preload=False)
        self._refill_spares()
        return session

    @staticmethod
    def _discard(session: _LiveSession, force: bool = False) -> None:
        session.jail.close(force=force)
        session.cgroups.destroy()

    # --- sessions ------------------------------------------------------------------------------

    def set_weights(self, weights: dict[str, float]) -> None:
        """The tenants' weights, by which the pool's capacity is shared (none: one tenant)."""
        self._weights = dict(weights)

    @property
    def live_count(self) -> int:
        """Sessions whose interpreter this pool holds now."""
        return len(self._live)

    def is_live(self, session_id: str) -> bool:
        """Whether this pool holds the session's interpreter (a forked one: in a live jail)."""
        live = self._live.get(session_id)
        return live is not None and (live.family is None or live.jail.alive())

    def run_cell(
        self,
        session_id: str,
        spec: ExecutionSpec,
        history: Sequence[RecordedCell] = (),
        cancel: Cancel | None = None,
    ) -> CellOutcome:
        """Run one cell of a session, rebuilding the session from `history` if not live here."""
        evicted: list[str] = []
        restored = False
        live = self._live.get(session_id)
        try:
            if live is None:
                evicted = self._make_room(tenant_of(session_id))
                live = self._take_jail()
                self._live[session_id] = live
                if history:
                    self._replay(live, spec, history)
                    restored = True
            self._live.move_to_end(session_id)
            if live.family is not None:  # the family's other interpreters count as processes
                more = spec.limits.max_processes + len(live.family) - 1
                spec = replace(spec, limits=replace(spec.limits, max_processes=more))
            reply = live.jail.run(spec, cancel, member=live.member)
            live.last_used = time.monotonic()  # idle from the end of its last cell
            if reply.setup_error == INTERPRETER_GONE:
                self.end(session_id)
                raise InterpreterGone(session_id)
        except LimitNotRestored:
            # The session's interpreters hold more than this cell's limit (memory the program
            # keeps): the session's own failure. Its family shares the memory: all of it ends.
            self._end_family(session_id)
            result = ExecutionResult.failure(
                Status.MEMORY_LIMIT, MEMORY_NOT_RESTORED, spec.execution_id
            )
            return CellOutcome(result, restored, alive=False, evicted=tuple(evicted))
        except ReplayDiverged as diverged:
            # The session's own cells ended its interpreter on replay (a cell that acts on
            # randomness, time, or whether it is replayed): the program's error, not ours.
            self.end(session_id, force=True)
            result = ExecutionResult.failure(Status.ERROR, str(diverged), spec.execution_id)
            return CellOutcome(result, True, alive=False, evicted=tuple(evicted))
        except (JailFailure, OSError) as exc:
            self.end(session_id, force=True)
            result = ExecutionResult.failure(
                Status.SANDBOX_ERROR, f"session sandbox failure: {exc}", spec.execution_id
            )
            return CellOutcome(result, restored, alive=False, evicted=tuple(evicted))
        if not reply.session_alive:
            self.end(session_id, force=True)
        return CellOutcome(to_result(spec, reply), restored, reply.session_alive, tuple(evicted))

    def _replay(
        self, live: _LiveSession, spec: ExecutionSpec, history: Sequence[RecordedCell]
    ) -> None:
        for number, cell in enumerate(history, start=1):
            replayed = replace(
                spec,
                code=cell.code,
                stdin=cell.stdin,
                files=cell.files,
                fetch_files=(),
                seed=cell.seed,
            )
            reply = live.jail.run(replayed)
            if not reply.session_alive:
                status = to_result(replayed, reply).status
                raise ReplayDiverged(
                    f"rl-sandbox: the session's cell {number} of {len(history)}, replayed to "
                    f"restore its state, ended its interpreter this time ({status}); the "
                    "session's state is lost and this cell did not run\n"
                )

    def _make_room(self, tenant: str, wanted: int = 1) -> list[str]:
        """End sessions so that `tenant` may hold `wanted` more (session_shares.py); raises
        JailFailure when its share cannot hold them."""
        capacity = self._settings.max_sessions_per_worker
        chosen = evictions(list(self._live), tenant, wanted, capacity, self._weights)
        if chosen is None:
            raise JailFailure(
                f"tenant {tenant!r} may hold fewer live sessions on a worker than {wanted}"
            )
        for session_id in chosen:
            self.end(session_id)
        return chosen

    def _end_family(self, session_id: str) -> None:
        live = self._live.get(session_id)
        family = set(live.family) if live is not None and live.family is not None else set()
        for member in sorted(family - {session_id}):
            self.end(member, force=True)
        self.end(session_id, force=True)

    def end(self, session_id: str, force: bool = False) -> bool:
        """End a live session; False if it was not live here. A forked session's interpreter
        alone ends while others share its jail (the jail ends with the last)."""
        live = self._live.pop(session_id, None)
        if live is None:
            return False
        if live.family is not None:
            live.family.discard(session_id)
            if live.family and live.jail.alive():
                live.jail.drop(live.member)
                return True
        self._discard(live, force=force)
        return True

    def fork(self, session_id: str, forks: Sequence[str]) -> list[str]:
        """Fork a live session's interpreter into live sessions `forks` (copy-on-write copies
        in its jail); the sessions evicted to make room. Raises JailFailure when the jail
        could not fork (the sessions are then rebuilt from their records when used)."""
        live = self._live.get(session_id)
        if live is None or not live.jail.alive():
            raise JailFailure("the session is not live here")
        tenant = tenant_of(session_id)
        if len(forks) + 1 > share(self._settings.max_sessions_per_worker, self._weights, tenant):
            raise JailFailure(
                f"more forks than tenant {tenant!r} may hold live sessions on a worker "
                "(its share of max_sessions_per_worker)"
            )
        self._live.move_to_end(session_id)
        evicted = self._make_room(tenant, len(forks))
        if session_id in evicted:
            raise JailFailure("the session was evicted")
        # Room in the pids limit for the copies, the middle process of the double fork and the
        # helper that freezes the parent's files, nothing more; the memory limit stays the last
        # cell's (the copies share its pages). The next cell sets its own limits again.
        family_size = 1 if live.family is None else len(live.family)
        needed = family_size + len(forks) + 2
        live.cgroups.set_max_processes(max(live.cgroups.max_processes, needed))
        members = live.jail.fork(live.member, len(forks))
        family = live.family if live.family is not None else {session_id}
        live.family = family
        for fork_id, member in zip(forks, members, strict=True):
            family.add(fork_id)
            self._live[fork_id] = _LiveSession(
                live.jail, live.cgroups, member=member, family=family
            )
        return evicted

    def expire_idle(self, now: float | None = None) -> list[str]:
        """End the sessions idle for longer than the TTL; return their ids."""
        now = time.monotonic() if now is None else now
        expired = [
            sid
            for sid, live in self._live.items()
            if now - live.last_used > self._settings.session_ttl_s
        ]
        for sid in expired:
            self.end(sid)
        return expired

    def close(self) -> None:
        """End every session and spare (waiting for spares still starting)."""
        for sid in list(self._live):
            self.end(sid)
        with self._lock:
            self._closed = True
        for thread in self._threads:
            thread.join(timeout=30)
        with self._lock:
            spares, self._spares = self._spares, []
        for spare in spares:
            self._discard(spare)
        with contextlib.suppress(OSError):
            self._log_path.unlink()
