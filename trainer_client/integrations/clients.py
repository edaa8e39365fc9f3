"""Clients for hooks that a trainer calls, not owns: one per event loop, made on first use.

A trainer builds its tools and loads its reward function before any event loop of ours runs,
then calls them from its own loop (verl's agent-loop and reward workers), from executor threads,
or from forked workers. A SandboxClient belongs to one event loop (its connections and batching
task do), so the async hooks take the client of the loop they run on; the sync hooks share one
SyncSandboxClient, which runs on a loop thread of its own and is safe from any thread. Both kinds
rebuild themselves after a fork (docs/client.md, "Fork safety").
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import weakref
from dataclasses import dataclass

from trainer_client.client import SandboxClient
from trainer_client.sync import SyncSandboxClient


@dataclass(frozen=True)
class ServiceAddress:
    """Where the service is: its URL, and the API key if it has one."""

    url: str
    api_key: str | None = None


class ClientPerLoop:
    """The SandboxClient of each running event loop, for async hooks."""

    def __init__(self, address: ServiceAddress) -> None:
        self.address = address
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SandboxClient] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> SandboxClient:
        """The client of the running loop (made and started on first use)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = SandboxClient(self.address.url, api_key=self.address.api_key)
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close the running loop's client (its connections); a later call makes a new one."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()


_SYNC_CLIENTS: dict[ServiceAddress, SyncSandboxClient] = {}
_SYNC_LOCK = threading.Lock()


def shared_sync_client(address: ServiceAddress) -> SyncSandboxClient:
    """The process's SyncSandboxClient for `address`, closed at exit."""
    with _SYNC_LOCK:
        client = _SYNC_CLIENTS.get(address)
        if client is None:
            client = SyncSandboxClient(address.url, api_key=address.api_key)
            _SYNC_CLIENTS[address] = client
        return client


@atexit.register
def close_shared_sync_clients() -> None:
    """Close every shared sync client (atexit does it; tests call it to check for leaks)."""
    with _SYNC_LOCK:
        clients = list(_SYNC_CLIENTS.values())
        _SYNC_CLIENTS.clear()
    for client in clients:
        client.close()
