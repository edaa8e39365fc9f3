"""`rl-sandbox api`: the API under uvicorn, draining on SIGTERM."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import resource
import signal
import sys
from types import FrameType

import uvicorn

from sandbox_service.api.app import create_app
from sandbox_service.api.connections import ConnectionLimits, bounded_protocol
from sandbox_service.logs import configure_logging
from sandbox_service.settings import Settings
from sandbox_service.tenants_file import TenantsFileError


class _DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT, refuse new executions at once; in-flight ones get the grace period."""

    def __init__(self, config: uvicorn.Config, dispatcher: object) -> None:
        super().__init__(config)
        self._dispatcher = dispatcher

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._dispatcher.draining = True  # type: ignore[attr-defined]
        super().handle_exit(sig, frame)


def serve(settings: Settings, host: str, port: int) -> int:
    """Serve the API until SIGTERM/SIGINT; returns the exit status."""
    configure_logging("api", settings.log_level)
    if settings.redis_url is None:
        print("rl-sandbox api: no Redis: set REDIS_URL (or RL_SANDBOX_REDIS_URL)", file=sys.stderr)
        return 2
    try:
        settings.credentials()  # the tenants file: refused here, with the table and field
    except TenantsFileError as exc:
        print(f"rl-sandbox api: {exc}", file=sys.stderr)
        return 2
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        backlog=4096,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s),
        timeout_keep_alive=math.ceil(settings.keep_alive_s),
        http=bounded_protocol(connection_limits(settings)),
        ws="none",  # no route upgrades; an Upgrade header is an ordinary request
    )
    _fit_open_files(settings.max_connections)
    _return_large_buffers()
    # uvicorn re-raises the stop signal once it has shut down, under the handler that was there
    # before it: make that one a no-op, so that a drained shutdown exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    _DrainingServer(config, app.state.context.dispatcher).run()
    return 0


def connection_limits(settings: Settings) -> ConnectionLimits:
    """The limits on clients' connections, from the settings of the same names."""
    return ConnectionLimits(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        max_connections=settings.max_connections,
        send_timeout_s=settings.send_timeout_s,
    )


def _fit_open_files(max_connections: int) -> None:
    """Raise the soft open-file limit so max_connections fit (with room for Redis and logs)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        new_soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, hard))
        if new_soft < wanted:
            logging.getLogger(__name__).warning(
                "open-file limit %d is below max_connections + 256 (%d): connections past it "
                "wait in the kernel's backlog",
                new_soft,
                wanted,
            )


_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 1 << 20


def _return_large_buffers() -> None:
    """Have glibc map every allocation over 1 MiB on its own, so that a large answer's buffers
    (a fetched file) go back to the system when the answer ends. By default glibc raises this
    threshold after the first large free, up to 32 MiB, and the next answers' buffers stay in
    the heap: the process kept tens of MiB after its unread answers were cut off."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): its own policy holds
        return
