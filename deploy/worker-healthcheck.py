#!/opt/venv/bin/python
"""Worker health for container healthchecks: Redis answers, and a worker of this host beats.

Each worker process scores itself in the `<queue>:alive` sorted set every worker_heartbeat_s,
under the name `<hostname>:<slot>:<pid>` (sandbox_service/worker/main.py). A container none of whose
worker processes has beaten within worker_dead_after_s is unhealthy and gets restarted.
"""

from __future__ import annotations

import socket
import sys
import time

from redis import Redis

from sandbox_service import keys
from sandbox_service.settings import Settings


def main() -> int:
    """Exit 0 when a worker process of this host beat recently, else 1 with the reason."""
    settings = Settings()
    if not settings.redis_url:
        print("unhealthy: no Redis configured (REDIS_URL)", file=sys.stderr)
        return 1
    redis = Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
    since = time.time() - settings.worker_dead_after_s
    fresh = redis.zrangebyscore(keys.alive(settings.queue_name), since, "+inf")
    host = socket.gethostname()
    mine = [m for m in fresh if m.decode().startswith(f"{host}:")]
    if not mine:
        print(
            f"unhealthy: no worker of {host} beat in {settings.worker_dead_after_s} s",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
