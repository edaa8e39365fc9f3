"""Tenants through the real service: two keys from a tenants file, each blind to the other's
sessions, each with its own quotas and share of the queue, and a flood from one that does not
hold back the other (fair share of the workers)."""

from __future__ import annotations

import asyncio
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
name = "omega"
key = "key-omega"
max_in_flight = 2
max_sessions = 2

[[tenant]]
name = "alpha"
key = "key-alpha"
"""
OMEGA = {"Authorization": "Bearer key-omega"}
ALPHA = {"Authorization": "Bearer key-alpha"}
OPERATOR = {"Authorization": "Bearer key-operator"}


@pytest.fixture(scope="module")
def tenants_stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    """Two workers, and an API with two tenants and a queue bound of 8 (a share of 4 each).

    The workers are not given the tenants file: they learn the tenants from Redis."""
    path = logs_dir / "tenants.toml"
    path.write_text(TENANTS)
    env = stack_env(
        redis_server.url, "tenants", 62800,
        max_queue_depth=8, retry_after_s=3, poll_interval_s=0.3,
    )  # fmt: skip
    keys_env = {"RL_SANDBOX_TENANTS_FILE": str(path), "RL_SANDBOX_OPERATOR_KEY": "key-operator"}
    yield from api_with_tenants(env, keys_env, logs_dir / "tenants.log")


@pytest.fixture
async def http(tenants_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=tenants_stack.url, timeout=60) as client:
        yield client


async def omega_in_flight(stack: Stack, client: redis.Redis, count: int) -> None:
    """Wait (up to 10 s) until omega's admitted, unanswered calls number `count`."""
    key = keys.in_flight(stack.queue, "omega")
    for _ in range(200):
        if client.zcard(key) == count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"omega never had {count} calls in flight ({client.zcard(key)})")


async def run(
    http: httpx.AsyncClient, headers: dict[str, str], code: str, **body: object
) -> httpx.Response:
    return await http.post("/execute", json={"code": code, **body}, headers=headers)


async def test_each_key_is_served_and_a_wrong_or_missing_key_is_401(
    http: httpx.AsyncClient,
) -> None:
    for headers in (OMEGA, ALPHA):
        response = await run(http, headers, "print(6 * 7)")
        assert response.status_code == 200 and response.json()["stdout"] == "42\n"
    for headers in ({}, {"Authorization": "Bearer key-gamma"}, {"Authorization": "key-omega"}):
        assert (await run(http, headers, "print(1)")).status_code == 401
        assert (await http.delete("/sessions/s", headers=headers)).status_code == 401
    # The operator key opens the per-tenant series and nothing else.
    assert (await run(http, OPERATOR, "print(1)")).status_code == 401
    everyone = await http.get("/metrics/tenants", headers=OPERATOR)
    assert everyone.status_code == 200
    responses = "rl_sandbox_tenant_http_responses_total"
    assert f'{responses}{{code="401",route="/execute",tenant=""}} 4.0' in everyone.text
    assert f'{responses}{{code="200",route="/execute",tenant="alpha"}}' in everyone.text


async def test_metrics_name_no_tenant_openly_and_a_tenants_key_sees_only_its_own(
    http: httpx.AsyncClient,
) -> None:
    for headers in (OMEGA, ALPHA):
        assert (await run(http, headers, "print(1)")).status_code == 200
    open_text = (await http.get("/metrics")).text
    assert "tenant=" not in open_text and "omega" not in open_text and "alpha" not in open_text
    assert 'rl_sandbox_http_responses_total{code="200",route="/execute"}' in open_text
    alpha = await http.get("/metrics/tenants", headers=ALPHA)
    assert alpha.status_code == 200
    assert 'rl_sandbox_tenant_executions_total{status="ok",tenant="alpha"}' in alpha.text
    assert "omega" not in alpha.text and 'tenant=""' not in alpha.text
    everyone = (await http.get("/metrics/tenants", headers=OPERATOR)).text
    assert 'tenant="alpha"' in everyone and 'tenant="omega"' in everyone
    for headers in ({}, {"Authorization": "Bearer key-gamma"}):
        assert (await http.get("/metrics/tenants", headers=headers)).status_code == 401


async def test_a_tenants_sessions_are_invisible_to_the_other(http: httpx.AsyncClient) -> None:
    first = await run(http, OMEGA, "secret = 'omega-only'", session_id="shared-name")
    assert first.json()["status"] == "ok"
    # The same id under the other key is another, fresh session.
    other = await run(http, ALPHA, "print(secret)", session_id="shared-name")
    assert other.json()["status"] == "error" and "NameError" in other.json()["stderr"]
    # Alpha cannot end omega's session: its id does not exist for alpha.
    await run(http, OMEGA, "pass", session_id="omega-private")
    assert (await http.delete("/sessions/omega-private", headers=ALPHA)).status_code == 404
    kept = await run(http, OMEGA, "print(secret)", session_id="shared-name")
    assert kept.json()["stdout"] == "omega-only\n"
    # Alpha's delete of its own same-named session leaves omega's alone.
    assert (await http.delete("/sessions/shared-name", headers=ALPHA)).status_code == 204
    kept = await run(http, OMEGA, "print(secret)", session_id="shared-name")
    assert kept.json()["stdout"] == "omega-only\n"
    for name in ("shared-name", "omega-private"):
        assert (await http.delete(f"/sessions/{name}", headers=OMEGA)).status_code == 204


async def test_the_in_flight_quota_is_429_for_that_tenant_only_and_freed_on_every_end(
    http: httpx.AsyncClient, tenants_stack: Stack, redis_client: redis.Redis
) -> None:
    slow = [asyncio.create_task(run(http, OMEGA, "import time; time.sleep(2)")) for _ in range(2)]
    await omega_in_flight(tenants_stack, redis_client, 2)
    over = await run(http, OMEGA, "print(1)")
    assert over.status_code == 429, over.text
    assert over.headers["retry-after"] == "3" and "in flight" in over.json()["detail"]
    assert (await run(http, ALPHA, "print(1)")).status_code == 200  # the other tenant is served
    assert all(r.status_code == 200 for r in await asyncio.gather(*slow))
    # A client that goes away frees its calls too.
    async with httpx.AsyncClient(base_url=str(http.base_url), timeout=0.5) as impatient:
        for _ in range(2):
            with pytest.raises(httpx.TimeoutException):
                await run(impatient, OMEGA, "import time; time.sleep(5)")
    await omega_in_flight(tenants_stack, redis_client, 0)
    response = await run(http, OMEGA, "print(2)")
    assert response.status_code == 200 and response.json()["stdout"] == "2\n"
    metrics = (await http.get("/metrics/tenants", headers=OPERATOR)).text
    rejected = 'rl_sandbox_tenant_rejected_requests_total{reason="in_flight_quota",tenant="omega"}'
    assert rejected in metrics
    assert 'rl_sandbox_tenant_executions_total{status="ok",tenant="alpha"}' in metrics


async def test_the_session_quota_is_429_until_a_session_ends(
    http: httpx.AsyncClient, tenants_stack: Stack, redis_client: redis.Redis
) -> None:
    # A new session in a call refused for another reason is not counted.
    slow = [asyncio.create_task(run(http, OMEGA, "import time; time.sleep(2)")) for _ in range(2)]
    await omega_in_flight(tenants_stack, redis_client, 2)
    refused = await run(http, OMEGA, "x = 1", session_id="never-admitted")
    assert refused.status_code == 429 and "in flight" in refused.json()["detail"]
    assert all(r.status_code == 200 for r in await asyncio.gather(*slow))
    for name in ("q1", "q2"):
        assert (await run(http, OMEGA, "x = 1", session_id=name)).status_code == 200
    third = await run(http, OMEGA, "x = 1", session_id="q3")
    assert third.status_code == 429 and "sessions" in third.json()["detail"]
    assert (await run(http, OMEGA, "x += 1", session_id="q1")).status_code == 200  # a live one
    assert (await run(http, ALPHA, "x = 1", session_id="q3")).status_code == 200  # other tenant
    assert (await http.delete("/sessions/q1", headers=OMEGA)).status_code == 204
    assert (await run(http, OMEGA, "x = 1", session_id="q3")).status_code == 200
    for name in ("q2", "q3"):
        assert (await http.delete(f"/sessions/{name}", headers=OMEGA)).status_code == 204
    assert (await http.delete("/sessions/q3", headers=ALPHA)).status_code == 204


async def test_forks_count_in_the_session_quota(http: httpx.AsyncClient) -> None:
    assert (await run(http, OMEGA, "x = 1", session_id="fp")).status_code == 200
    # Two forks would make three sessions of a quota of two: refused, nothing made or counted.
    over = await http.post("/sessions/fp/fork", json={"n": 2}, headers=OMEGA)
    assert over.status_code == 429 and "sessions" in over.json()["detail"], over.text
    made = await http.post("/sessions/fp/fork", json={"n": 1}, headers=OMEGA)
    assert made.status_code == 200, made.text
    (fork,) = made.json()["session_ids"]
    third = await run(http, OMEGA, "x = 1", session_id="fq")
    assert third.status_code == 429 and "sessions" in third.json()["detail"]
    # A fork of an unknown session is 404 and leaves nothing counted.
    assert (await http.delete(f"/sessions/{fork}", headers=OMEGA)).status_code == 204
    missing = await http.post("/sessions/no-such/fork", json={"n": 1}, headers=OMEGA)
    assert missing.status_code == 404, missing.text
    assert (await run(http, OMEGA, "x = 1", session_id="fq")).status_code == 200
    for name in ("fp", "fq"):
        assert (await http.delete(f"/sessions/{name}", headers=OMEGA)).status_code == 204


async def batch(
    http: httpx.AsyncClient, headers: dict[str, str], codes: list[str]
) -> httpx.Response:
    body = {"requests": [{"code": code} for code in codes]}
    return await http.post("/execute/batch", json=body, headers=headers)


async def test_a_flooding_tenant_neither_fills_the_queue_nor_the_workers_for_the_other(
    http: httpx.AsyncClient, tenants_stack: Stack, redis_client: redis.Redis
) -> None:
    alpha_queue = keys.rq_queue(keys.tenant_queue(tenants_stack.queue, "alpha"))
    slow = [f"import time; time.sleep(2); print({i})" for i in range(6)]
    # Alpha's share of the bound of 8 is 4: a batch of 4 fits, the two workers run two of it.
    first = asyncio.create_task(batch(http, ALPHA, slow[:4]))
    await wait_list_length(redis_client, alpha_queue, 2)
    second = asyncio.create_task(batch(http, ALPHA, slow[4:]))
    await wait_list_length(redis_client, alpha_queue, 4)
    refused = await run(http, ALPHA, "print('more')")
    assert refused.status_code == 429 and "share of the queue" in refused.json()["detail"]
    # Omega is admitted, and served by the next free worker, ahead of alpha's backlog of 4
    # (workers list the tenants' queues by name: a fixed order would serve alpha's first).
    answered = await run(http, OMEGA, "print('omega')")
    assert answered.status_code == 200 and answered.json()["stdout"] == "omega\n"
    assert redis_client.llen(alpha_queue) >= 2, "omega waited behind alpha's backlog"
    results = [r for response in (await first, await second) for r in response.json()["results"]]
    assert [r["stdout"] for r in results] == [f"{i}\n" for i in range(6)]


async def test_a_batch_over_the_tenants_in_flight_quota_is_invalid_not_overloaded(
    http: httpx.AsyncClient,
) -> None:
    body = {"requests": [{"code": f"print({i})"} for i in range(3)]}
    refused = await http.post("/execute/batch", json=body, headers=OMEGA)
    assert refused.status_code == 422, refused.text  # a 429 would be retried forever
    (problem,) = refused.json()["detail"]
    assert problem["loc"] == ["body", "requests"] and "at most 2" in problem["msg"]
    served = await http.post("/execute/batch", json=body, headers=ALPHA)
    assert served.status_code == 200
    assert [r["stdout"] for r in served.json()["results"]] == ["0\n", "1\n", "2\n"]
