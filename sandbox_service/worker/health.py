"""`rl-sandbox worker-health`: a worker container's health check, from the liveness set."""

from __future__ import annotations

import socket
import sys

import redis

from sandbox_service.broker.liveness import Liveness
from sandbox_service.settings import Settings


def worker_health(settings: Settings) -> int:
    """0 when a worker process of this host beat within worker_dead_after_s, else 1 and why."""
    if not settings.redis_url:
        print("unhealthy: no Redis configured (RL_SANDBOX_REDIS_URL or REDIS_URL)", file=sys.stderr)
        return 1
    connection = redis.Redis.from_url(
        settings.redis_url, socket_timeout=5, socket_connect_timeout=5
    )
    host = socket.gethostname()
    try:
        mine = Liveness.of(settings).live_workers_of_host(connection, host)
    except redis.RedisError as exc:
        print(f"unhealthy: Redis unreachable: {exc}", file=sys.stderr)
        return 1
    if not mine:
        print(
            f"unhealthy: no worker of {host} beat in {settings.worker_dead_after_s} s",
            file=sys.stderr,
        )
        return 1
    return 0
