"""A sandbox, context or session of one tenant is invisible to another: the API app in process on
a real Redis, each request bound to a tenant the way the edge binds one from its key (the binding
itself is the edge's; here a header names the tenant)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from starlette.types import Receive, Scope, Send

from sandbox_service.api.app import create_app
from sandbox_service.api.compat.wires import _with_tenant
from sandbox_service.local.redis_server import RedisServer
from sandbox_service.settings import Settings
from sandbox_service.tenancy import Tenant, tenant_var


@asynccontextmanager
async def tenant_client(redis_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The app in process (its lifespan entered and left in the caller's task); with no worker,
    a sandbox's kill forgets its sessions after the 1 s queue deadline."""
    settings = Settings(
        redis_url=redis_url, queue_name="rlst-tenants", queue_deadline_s=1, e2b_max_sandboxes=2
    )
    app = create_app(settings)

    async def bound(scope: Scope, receive: Receive, send: Send) -> None:
        name = dict(scope.get("headers", [])).get(b"x-test-tenant", b"default").decode()
        token = tenant_var.set(Tenant(name))
        try:
            await app(scope, receive, send)
        finally:
            tenant_var.reset(token)

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=bound)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def test_another_tenant_finds_no_sandbox(compat_redis: RedisServer) -> None:
    async with tenant_client(compat_redis.url) as client:
        await _isolated(client)


async def _isolated(as_tenant: httpx.AsyncClient) -> None:
    alice, bob = {"x-test-tenant": "alice"}, {"x-test-tenant": "bob"}
    created = await as_tenant.post("/v2/sandboxes", json={"timeout": 60}, headers=alice)
    assert created.status_code == 201
    sandbox = created.json()
    path = f"/sandboxes/{sandbox['sandboxID']}"
    assert (await as_tenant.get(path, headers=bob)).status_code == 404
    assert (
        await as_tenant.post(f"{path}/timeout", json={"timeout": 5}, headers=bob)
    ).status_code == 404
    assert (await as_tenant.post(f"/v2{path}/connect", json={}, headers=bob)).status_code == 404
    assert (await as_tenant.delete(path, headers=bob)).status_code == 404
    assert (await as_tenant.get("/v2/sandboxes", headers=bob)).json() == []
    listed = (await as_tenant.get("/v2/sandboxes", headers=alice)).json()
    assert [s["sandboxID"] for s in listed] == [sandbox["sandboxID"]]
    # the data plane is the sandbox's token's, whoever asks: without it the sandbox is not there
    plane = {"E2b-Sandbox-Id": sandbox["sandboxID"], "E2b-Sandbox-Port": "49999"}
    assert (await as_tenant.get("/contexts", headers={**plane, **bob})).status_code == 502
    token = {"X-Access-Token": sandbox["envdAccessToken"]}
    contexts = await as_tenant.get("/contexts", headers={**plane, **token, **alice})
    assert [c["id"] for c in contexts.json()] == ["default"]
    # two live sandboxes per tenant here: alice's second is taken, her third refused, bob's not
    assert (await as_tenant.post("/sandboxes", json={}, headers=alice)).status_code == 201
    refused = await as_tenant.post("/sandboxes", json={}, headers=alice)
    assert refused.status_code == 429 and refused.json()["code"] == 429
    assert (await as_tenant.post("/sandboxes", json={}, headers=bob)).status_code == 201
    assert (await as_tenant.delete(path, headers=alice)).status_code == 204
    assert (await as_tenant.get(path, headers=alice)).status_code == 404
    assert (await as_tenant.post("/sandboxes", json={}, headers=alice)).status_code == 201


def test_mcp_tools_see_the_request_tenant_only() -> None:
    token = tenant_var.set(Tenant("alice"))
    try:
        scope = {"headers": [(b"x-rl-sandbox-tenant", b"bob"), (b"accept", b"*/*")]}
        headers = _with_tenant(scope)["headers"]
    finally:
        tenant_var.reset(token)
    assert [v for k, v in headers if k == b"x-rl-sandbox-tenant"] == [b"alice"]
