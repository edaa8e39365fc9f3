"""Cells through real processes: two private Redis servers, one worker process per cell, one API
with both (`cells`). Calls spread over both cells, sessions keep their state in their cell, a
group cancel reaches both cells, and losing one cell's Redis under load answers every call
(ok or a retryable status) while new calls run on the other cell and /readyz stays 200.

Which cell ran what is read from each cell's own Redis (the workers' stats), never from the API.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from sandbox_service import keys
from sandbox_service.local.redis_server import RedisServer, start_redis_server
from tests.host_tag import tagged
from tests.service.stack import Stack, spawn, stack_env
from tests.service.stack import stop as stop_process

pytestmark = pytest.mark.slow

RETRYABLE = {"sandbox_error", "queue_timeout"}
SLEEP = "import time\ntime.sleep(15)\nprint('finished')"


class TwoCells:
    def __init__(self, servers: list[RedisServer], api: Stack, queue: str) -> None:
        self.servers = servers
        self.api = api
        self.queue = queue
        self.clients = [redis.Redis.from_url(s.url) for s in servers]

    def jobs_done(self, cell: int) -> int:
        """Jobs the cell's workers finished (their published stats)."""
        client = self.clients[cell]
        total = 0
        for key in client.scan_iter(keys.worker_stats(self.queue, "*")):
            value = client.get(key)
            if value is not None:
                total += sum(json.loads(value)["jobs"].values())
        return total

    def sessions(self, cell: int) -> int:
        client = self.clients[cell]
        values = [client.get(k) for k in client.scan_iter(keys.worker_stats(self.queue, "*"))]
        return sum(json.loads(v)["sessions"] for v in values if v is not None)


@pytest.fixture(scope="module")
def cells(logs_dir: Path) -> Iterator[TwoCells]:
    servers = [start_redis_server(), start_redis_server()]
    queue = "rlst-cells"
    envs = [
        stack_env(
            s.url,
            "cells",
            65100 + 100 * i,
            cgroup_parent=tagged(f"rl-sandbox-svctest-cells{i}"),
            max_timeout=30,
            max_batch=64,
        )
        for i, s in enumerate(servers)
    ]
    log = logs_dir / "cells.log"
    second_worker = spawn(["worker"], envs[1], log)
    api = Stack({**envs[0], "RL_SANDBOX_CELLS": servers[1].url}, log)
    try:
        api.start()
        both = TwoCells(servers, api, queue)
        deadline = time.monotonic() + 90
        while "2 of 2 cells ready" not in httpx.get(f"{api.url}/readyz").text:
            assert time.monotonic() < deadline, httpx.get(f"{api.url}/readyz").text
            time.sleep(0.2)
        time.sleep(1.5)  # the API's probe (once a second) has counted both cells' workers
        yield both
    finally:
        api.stop()
        stop_process(second_worker)
        for server in servers:
            server.stop()


@pytest.fixture
async def http(cells: TwoCells) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=cells.api.url, timeout=90) as client:
        yield client


async def _execute(http: httpx.AsyncClient, body: dict[str, Any]) -> httpx.Response:
    return await http.post("/execute", json=body)


async def _wait_stats(condition: Any) -> None:
    for _ in range(50):  # 10 s: the stats are published with each heartbeat (1 s)
        if condition():
            return
        await asyncio.sleep(0.2)


async def test_stateless_calls_spread_over_both_cells(
    cells: TwoCells, http: httpx.AsyncClient
) -> None:
    before = [cells.jobs_done(0), cells.jobs_done(1)]
    code = "import time\ntime.sleep(0.3)\nprint(6 * 7)"
    answers = await asyncio.gather(*(_execute(http, {"code": code}) for _ in range(16)))
    assert all(a.status_code == 200 and a.json()["stdout"] == "42\n" for a in answers)
    await _wait_stats(lambda: sum(cells.jobs_done(c) - before[c] for c in (0, 1)) >= 16)
    done = [cells.jobs_done(c) - before[c] for c in (0, 1)]
    print(f"calls per cell: {done}")
    assert done[0] > 0 and done[1] > 0
    assert sum(done) == 16


async def test_sessions_keep_their_state_in_their_cell(
    cells: TwoCells, http: httpx.AsyncClient
) -> None:
    sessions = [f"cells-session-{i}" for i in range(8)]
    for sid in sessions:
        first = await _execute(http, {"code": f"x = {len(sid)}", "session_id": sid})
        assert first.status_code == 200 and first.json()["status"] == "ok", first.text
    for _ in range(2):
        for sid in sessions:
            again = await _execute(http, {"code": "x += 1\nprint(x)", "session_id": sid})
            assert again.json()["status"] == "ok", again.text
    # One batch over sessions of both cells (split per cell), with a stateless call in it.
    batch = [{"code": "print(x)", "session_id": sid} for sid in sessions] + [{"code": "print(7)"}]
    last = await http.post("/execute/batch", json={"requests": batch})
    assert last.status_code == 200, last.text
    outputs = [r["stdout"] for r in last.json()["results"]]
    assert outputs == [f"{len(sid) + 2}\n" for sid in sessions] + ["7\n"]
    await _wait_stats(lambda: cells.sessions(0) + cells.sessions(1) >= len(sessions))
    held = [cells.sessions(0), cells.sessions(1)]
    print(f"sessions per cell: {held}")
    assert held[0] > 0 and held[1] > 0
    for sid in sessions:
        assert (await http.delete(f"/sessions/{sid}")).status_code == 204
        gone = await http.delete(f"/sessions/{sid}")
        assert gone.status_code == 404


async def test_a_group_cancel_reaches_both_cells(cells: TwoCells, http: httpx.AsyncClient) -> None:
    body = {"code": SLEEP, "group": "cells-group", "timeout": 20}
    await asyncio.sleep(2)  # the stats hold the earlier tests' jobs (published each second)
    before = [cells.jobs_done(0), cells.jobs_done(1)]
    calls = [asyncio.create_task(_execute(http, body)) for _ in range(4)]
    await asyncio.sleep(3)  # all admitted, two running per cell
    cancel = await http.post("/groups/cells-group/cancel")
    assert cancel.status_code == 200, cancel.text
    answers = await asyncio.gather(*calls)
    assert [a.json()["status"] for a in answers] == ["cancelled"] * 4
    assert cancel.json()["cancelled"] == 4
    await _wait_stats(lambda: sum(cells.jobs_done(c) - before[c] for c in (0, 1)) >= 4)
    done = [cells.jobs_done(c) - before[c] for c in (0, 1)]
    print(f"cancelled calls per cell: {done}")
    assert done[0] > 0 and done[1] > 0


async def test_losing_one_cells_redis_keeps_the_service_up(
    cells: TwoCells, http: httpx.AsyncClient
) -> None:
    code = "import time\ntime.sleep(2)\nprint('done')"
    calls = [asyncio.create_task(_execute(http, {"code": code})) for _ in range(30)]
    await asyncio.sleep(1.0)
    started = time.perf_counter()
    cells.servers[1].stop()
    answers = await asyncio.wait_for(asyncio.gather(*calls), timeout=100)
    statuses = [a.json()["status"] if a.status_code == 200 else str(a.status_code) for a in answers]
    print(f"answers with cell 1 lost: {sorted(statuses)} in {time.perf_counter() - started:.1f} s")
    assert set(statuses) <= {"ok", "503", *RETRYABLE}, statuses
    ready = await http.get("/readyz")
    assert ready.status_code == 200 and "cell 1 down" in ready.json()["detail"], ready.text
    await asyncio.sleep(2.5)  # the probe has seen it down
    after = await asyncio.gather(*(_execute(http, {"code": "print(1)"}) for _ in range(6)))
    assert [a.json()["stdout"] for a in after] == ["1\n"] * 6, [a.text for a in after]


async def test_the_lost_cell_rejoins_when_its_redis_returns(
    cells: TwoCells, http: httpx.AsyncClient
) -> None:
    lost = cells.servers[1]
    cells.servers[1] = start_redis_server(port=lost.port)  # empty, on the address it had
    cells.clients[1] = redis.Redis.from_url(cells.servers[1].url)
    deadline = time.monotonic() + 60
    while "2 of 2 cells ready" not in (await http.get("/readyz")).text:
        assert time.monotonic() < deadline, (await http.get("/readyz")).text
        await asyncio.sleep(0.5)
    code = "import time\ntime.sleep(0.3)\nprint(6 * 7)"
    # The first admission on the cell's old connection may fail (and go to the other cell).
    for _ in range(3):
        await asyncio.sleep(1.5)  # the probe has counted its workers again
        answers = await asyncio.gather(*(_execute(http, {"code": code}) for _ in range(8)))
        assert all(a.status_code == 200 and a.json()["stdout"] == "42\n" for a in answers), [
            a.text for a in answers
        ]
        await _wait_stats(lambda: cells.jobs_done(1) > 0)
        if cells.jobs_done(1) > 0:
            break
    assert cells.jobs_done(1) > 0
