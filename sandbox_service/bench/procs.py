"""What the service's processes spend during a benchmark point: CPU per call and API memory.

CPU is counted per component (api, workers, their jails, redis, and the bench itself) as
user + system time of each live process plus the time of its children it has reaped, so work
done in the short-lived processes of a jail is counted in the zygote that waited for them.
When a jail ends during a point (recycled), its CPU moves to the worker that reaps it,
so the split between components would be wrong for that point: the workers and their jails are
then reported together as `workers` (with `jail` absent); the total stays right.
The API's resident memory is sampled every RSS_EVERY_S while a point runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import psutil

RSS_EVERY_S = 0.1
"""How often the API's RSS is sampled during a point."""
_CPUCLOCK_SCHED = 2
"""The kernel's process-wide scheduler CPU clock (see _cpu_s)."""


def _component(proc: psutil.Process) -> str:
    cmdline = " ".join(proc.cmdline())
    if "redis-server" in cmdline:
        return "redis"
    if " api" in cmdline:
        return "api"
    if "nsjail" in cmdline or "zygote" in cmdline:
        return "jail"
    return "workers"


def _cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of a process (all its threads) and of its reaped children.

    Its own time is read from its CPU clock (Linux: clockid ((~pid) << 3) | CPUCLOCK_SCHED, in
    nanoseconds): /proc/<pid>/stat counts 10 ms ticks, and a short point of a few calls then
    reads 0 ms or 10 ms of API CPU. Reaped children's time exists only in ticks.
    """
    times = proc.cpu_times()
    try:
        own = time.clock_gettime(((~proc.pid) << 3) | _CPUCLOCK_SCHED)
    except OSError:  # gone meanwhile, or not Linux
        own = times.user + times.system
    return float(own + times.children_user + times.children_system)


class StackSampler:
    """Samples the processes of one service on this machine (see the module doc)."""

    def __init__(self, root: psutil.Process | None, api: psutil.Process | None) -> None:
        self._root = root
        self._api = api
        self._cpu_at_start: dict[str, float] = {}
        self._jails_at_start: set[int] = set()
        self._rss: list[int] = []
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of_stack(cls, pid: int) -> StackSampler:
        """The sampler of a private `rl-sandbox up` and everything it started."""
        return cls(psutil.Process(pid), None)

    @classmethod
    def of_listener(cls, port: int) -> StackSampler | None:
        """The sampler of the local API process listening on `port` (API only), if visible."""
        with contextlib.suppress(psutil.Error, OSError):
            for conn in psutil.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
                    return cls(None, psutil.Process(conn.pid))
        return None

    def refresh(self) -> None:
        """Find the API process of a private stack (once it is up)."""
        if self._root is None:
            return
        for proc in self._root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if _component(proc) == "api":
                    self._api = proc

    def _processes(self) -> list[tuple[str, psutil.Process]]:
        found: list[tuple[str, psutil.Process]] = [("bench", psutil.Process(os.getpid()))]
        if self._root is not None:
            for proc in self._root.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    found.append((_component(proc), proc))
        elif self._api is not None:
            found.append(("api", self._api))
        return found

    def _cpu(self) -> tuple[dict[str, float], set[int]]:
        by_component: dict[str, float] = {}
        jails: set[int] = set()
        for name, proc in self._processes():
            with contextlib.suppress(psutil.Error):
                by_component[name] = by_component.get(name, 0.0) + _cpu_s(proc)
                if proc.name() == "nsjail":  # reaped by a worker: its CPU moves to `workers`
                    jails.add(proc.pid)
        return by_component, jails

    def start(self) -> None:
        """Begin a point: remember CPU times, start sampling the API's RSS."""
        self._cpu_at_start, self._jails_at_start = self._cpu()
        self._rss = []
        if self._api is not None:
            self._task = asyncio.create_task(self._sample_rss(self._api))

    async def _sample_rss(self, api: psutil.Process) -> None:
        while True:
            with contextlib.suppress(psutil.Error):
                self._rss.append(api.memory_info().rss)
            await asyncio.sleep(RSS_EVERY_S)

    async def stop(self, calls: int) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """End a point: (CPU ms per call by component, API RSS MiB at start, max and end)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        end, jails = self._cpu()
        start = dict(self._cpu_at_start)
        if self._jails_at_start - jails:  # a jail ended: see the module doc
            for totals in (start, end):
                totals["workers"] = totals.get("workers", 0.0) + totals.pop("jail", 0.0)
        cpu = {
            name: round(1000 * (end[name] - start.get(name, 0.0)) / max(calls, 1), 3)
            for name in sorted(end)
        }
        cpu["total"] = round(sum(v for k, v in cpu.items() if k != "bench"), 3)
        rss: dict[str, dict[str, float]] = {}
        if self._rss:
            mib = [r / 2**20 for r in self._rss]
            rss["api"] = {
                "start": round(mib[0], 1),
                "max": round(max(mib), 1),
                "end": round(mib[-1], 1),
            }
        return cpu, rss
