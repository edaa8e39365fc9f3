"""`rl-sandbox worker`: run settings.workers worker processes on this host and keep them running.

Each child owns one executor slot (its index selects the jail's uid and cgroup). A child that dies
is restarted with backoff, and is dropped from the alive set at once, so the API re-runs the job
it held without waiting for its heartbeat to go stale. SIGTERM/SIGINT: every child finishes its
current job (RQ warm shutdown) within shutdown_grace_s; a worker still there is asked for its
threads' stacks (logged, to show where it hung), then killed, and what its jails left (processes,
cgroups) is removed.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import redis

from sandbox_service.broker import worker_stats
from sandbox_service.broker.liveness import Liveness
from sandbox_service.jail import cgroups
from sandbox_service.local import procs
from sandbox_service.logs import fields
from sandbox_service.settings import Settings
from sandbox_service.worker.main import STACK_DUMP_SIGNAL, forget_worker_queue, worker_name

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)
"""Delay before restarting a slot's worker, by its number of recent crashes."""
STABLE_AFTER_S = 60.0
"""A worker that ran this long resets its slot's crash count."""


def worker_argv(slot: int) -> list[str]:
    """The command line of the worker process of one slot."""
    return [sys.executable, "-m", "sandbox_service.worker.main", "--slot", str(slot)]


def run_workers(settings: Settings, count: int) -> int:
    """Supervise `count` workers until SIGTERM/SIGINT; returns the exit status."""
    if settings.redis_url is None:
        log.error("no Redis: set RL_SANDBOX_REDIS_URL (or REDIS_URL)")
        return 2
    stop = procs.stop_event()
    connection = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=1.0)
    children: dict[int, subprocess.Popen[bytes]] = {}
    started_at: dict[int, float] = {}
    crashes: dict[int, int] = dict.fromkeys(range(count), 0)
    restart_at: dict[int, float] = dict.fromkeys(range(count), 0.0)
    log.info("starting workers", extra=fields(workers=count, mode=settings.executor_mode))
    while not stop.is_set():
        now = time.monotonic()
        for slot, child in list(children.items()):
            code = child.poll()
            if code is None:
                continue
            del children[slot]
            _forget(connection, settings, worker_name(slot, child.pid))
            if now - started_at[slot] > STABLE_AFTER_S:
                crashes[slot] = 0
            delay = RESTART_BACKOFF_S[min(crashes[slot], len(RESTART_BACKOFF_S) - 1)]
            crashes[slot] += 1
            restart_at[slot] = now + delay
            log.warning("worker exited", extra=fields(slot=slot, code=code, restart_in_s=delay))
        for slot in range(count):
            if slot not in children and now >= restart_at[slot]:
                children[slot] = procs.spawn(worker_argv(slot))
                started_at[slot] = now
        stop.wait(0.1)
    log.info("stopping workers", extra=fields(grace_s=settings.shutdown_grace_s))
    killed = procs.stop(
        list(children.values()), settings.shutdown_grace_s, dump_signal=STACK_DUMP_SIGNAL
    )
    for slot, child in children.items():
        _forget(connection, settings, worker_name(slot, child.pid))
    if killed:
        log.warning(
            "workers killed after the grace period; their stacks are above",
            extra=fields(slots=[s for s, c in children.items() if c.pid in killed]),
        )
    # A worker killed at the deadline could not close its jails; end them and their cgroups.
    left = cgroups.remove_stale(settings.cgroup_parent)
    if left:
        log.error("slot cgroups left behind", extra=fields(cgroups=[str(p) for p in left]))
    return 0


def _forget(connection: redis.Redis, settings: Settings, name: str) -> None:
    liveness = Liveness.of(settings)
    liveness.leave(connection, name)
    worker_stats.forget(connection, liveness, name)
    forget_worker_queue(connection, settings.queue_name, name)
