"""What the service holds for a tenant, charged to it and bounded, with two tenants: live session
interpreters (a worker's capacity shared by weight), recorded session cells, and a worker's time
(shared at the call, not the chunk)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import redis

from sandbox_service import keys
from sandbox_service.local.redis_server import RedisServer
from tests.service.stack import Stack, api_with_tenants, stack_env, wait_list_length

TENANTS = """
[[tenant]]
name = "alpha"
key = "key-alpha"

[[tenant]]
name = "beta"
key = "key-beta"
"""
ALPHA = {"Authorization": "Bearer key-alpha"}
BETA = {"Authorization": "Bearer key-beta"}
OPERATOR = {"Authorization": "Bearer key-operator"}
CAPACITY = 8
"""Live sessions the one worker holds: a share of 4 for each tenant."""
SHARE = CAPACITY // 2
SESSION_RECORDED = 64 << 10
TENANT_RECORDED = 160 << 10


@pytest.fixture(scope="module")
def capacity_stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    """One worker holding CAPACITY live sessions, an API with two tenants of equal weight."""
    path = logs_dir / "tenant-capacity.toml"
    path.write_text(TENANTS)
    env = stack_env(
        redis_server.url, "tenant-capacity", 72000, workers=1,
        max_sessions_per_worker=CAPACITY, max_session_recorded_bytes=SESSION_RECORDED,
        max_tenant_recorded_bytes=TENANT_RECORDED, operator_key="key-operator",
    )  # fmt: skip
    api_env = {"RL_SANDBOX_TENANTS_FILE": str(path)}
    yield from api_with_tenants(env, api_env, logs_dir / "tenant-capacity.log")


@pytest.fixture
async def http(capacity_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=capacity_stack.url, timeout=120) as client:
        yield client


async def post_cell(
    http: httpx.AsyncClient, headers: dict[str, str], session: str, code: str, stdin: str = ""
) -> httpx.Response:
    body = {"code": code, "session_id": session, "stdin": stdin}
    return await http.post("/execute", json=body, headers=headers)


async def cell(
    http: httpx.AsyncClient, headers: dict[str, str], session: str, code: str, stdin: str = ""
) -> dict[str, object]:
    response = await post_cell(http, headers, session, code, stdin)
    assert response.status_code == 200, response.text
    result: dict[str, object] = response.json()
    assert result["status"] == "ok", result
    return result


async def test_a_tenant_past_its_share_of_sessions_gets_429_and_never_evicts_anothers(
    http: httpx.AsyncClient,
) -> None:
    draw = "import random\nvalue = random.random()\nvalue"
    beta = f"b-{uuid.uuid4().hex}"
    drawn = (await cell(http, BETA, beta, draw))["stdout"]
    alphas = [f"a-{uuid.uuid4().hex}" for _ in range(SHARE)]
    for session in alphas:
        await cell(http, ALPHA, session, draw)
    over = await post_cell(http, ALPHA, f"a-{uuid.uuid4().hex}", draw)
    assert over.status_code == 429, over.text
    assert "share of the live-session slots" in over.json()["detail"]
    assert over.headers["Retry-After"]
    forks = await http.post(f"/sessions/{alphas[0]}/fork", json={"n": 2}, headers=ALPHA)
    assert forks.status_code == 429, forks.text
    # Beta's interpreter is still the live one: not rebuilt, its unseeded value unchanged.
    again = await cell(http, BETA, beta, "value")
    assert (again["restored"], again["stdout"]) == (False, drawn)
    # An ended session makes room for another of the same tenant.
    assert (await http.delete(f"/sessions/{alphas[0]}", headers=ALPHA)).status_code == 204
    room = f"a-{uuid.uuid4().hex}"
    await cell(http, ALPHA, room, "1")
    for session in [*alphas[1:], room, beta]:
        headers = BETA if session == beta else ALPHA
        assert (await http.delete(f"/sessions/{session}", headers=headers)).status_code == 204


def recorded_gauge(metrics: str, tenant: str) -> float:
    prefix = f'rl_sandbox_tenant_session_recorded_bytes{{tenant="{tenant}"}} '
    (line,) = [line for line in metrics.splitlines() if line.startswith(prefix)]
    return float(line.removeprefix(prefix))


async def test_recorded_bytes_are_bounded_per_session_and_per_tenant_and_shown_per_tenant(
    http: httpx.AsyncClient,
) -> None:
    stdin = "a" * (40 << 10)  # recorded with its cell
    first = f"a-{uuid.uuid4().hex}"
    await cell(http, ALPHA, first, "1", stdin)
    over_session = await post_cell(http, ALPHA, first, "2", stdin)
    assert over_session.status_code == 422, over_session.text
    assert "max_session_recorded_bytes" in over_session.json()["detail"]
    assert (await cell(http, ALPHA, first, "3"))["stdout"] == "3\n"  # a small cell still fits
    others = [f"a-{uuid.uuid4().hex}" for _ in range(3)]
    for session in others[:2]:
        await cell(http, ALPHA, session, "1", stdin)
    over_tenant = await post_cell(http, ALPHA, others[2], "1", stdin)
    assert over_tenant.status_code == 429, over_tenant.text
    assert "max_tenant_recorded_bytes" in over_tenant.json()["detail"]
    assert over_tenant.headers["Retry-After"]
    # The other tenant's sessions record on; the operator sees each tenant's bytes.
    await cell(http, BETA, f"b-{uuid.uuid4().hex}", "1", stdin)
    metrics = (await http.get("/metrics/tenants", headers=OPERATOR)).text
    assert recorded_gauge(metrics, "alpha") > 3 * len(stdin)
    assert len(stdin) < recorded_gauge(metrics, "beta") < 2 * len(stdin)
    own = (await http.get("/metrics/tenants", headers=BETA)).text
    assert 'tenant="alpha"' not in own
    assert recorded_gauge(own, "beta") == recorded_gauge(metrics, "beta")
    aggregate = (await http.get("/metrics")).text
    assert 'tenant="' not in aggregate
    assert "rl_sandbox_session_recorded_bytes " in aggregate
    # An ended session's records are uncharged at once.
    assert (await http.delete(f"/sessions/{first}", headers=ALPHA)).status_code == 204
    await cell(http, ALPHA, others[2], "1", stdin)


async def test_a_worker_running_one_tenants_chunk_takes_anothers_call_between_its_calls(
    http: httpx.AsyncClient, capacity_stack: Stack, redis_client: redis.Redis
) -> None:
    for headers in (ALPHA, BETA):  # the worker listens on both tenants' queues
        assert (await http.post("/execute", json={"code": "1"}, headers=headers)).is_success
    stamp = "import time\nstarted = time.time()\ntime.sleep(0.5)\nprint(repr(started))"
    body = {"requests": [{"code": stamp} for _ in range(8)]}  # one worker: 2 chunks of 4
    flood = asyncio.create_task(http.post("/execute/batch", json=body, headers=ALPHA))
    alpha_queue = keys.rq_queue(keys.tenant_queue(capacity_stack.queue, "alpha"))
    await wait_list_length(redis_client, alpha_queue, 1)  # the first chunk runs
    light = await http.post(
        "/execute", json={"code": "import time\nprint(repr(time.time()))"}, headers=BETA
    )
    assert light.status_code == 200 and light.json()["status"] == "ok", light.text
    answered = await flood
    assert answered.status_code == 200, answered.text
    starts = [float(result["stdout"]) for result in answered.json()["results"]]
    # Beta's call ran between the first chunk's calls, not after the chunk.
    assert float(light.json()["stdout"]) < starts[3], (light.json()["stdout"], starts)
