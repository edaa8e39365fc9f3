"""A sandbox, context or session of one tenant is invisible to another: the API app in process on
a real Redis, behind its real edge, with two tenants from a tenants file (each request carries
its tenant's key)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from sandbox_service.api.app import create_app
from sandbox_service.api.compat.wires import _with_tenant
from sandbox_service.local.redis_server import RedisServer
from sandbox_service.settings import Settings
from sandbox_service.tenancy import Tenant, tenant_var

TENANTS = """
[[tenant]]
name = "alice"
key = "alice-key-0123456789"

[[tenant]]
name = "bob"
key = "bob-key-0123456789"
"""


@asynccontextmanager
async def tenant_client(redis_url: str, tenants_file: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app in process (its lifespan entered and left in the caller's task); with no worker,
    a sandbox's kill forgets its sessions after the 1 s queue deadline."""
    settings = Settings(
        redis_url=redis_url,
        queue_name="rlst-tenants",
        queue_deadline_s=1,
        e2b_max_sandboxes=2,
        tenants_file=tenants_file,
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def test_another_tenant_finds_no_sandbox(compat_redis: RedisServer, tmp_path: Path) -> None:
    tenants_file = tmp_path / "tenants.toml"
    tenants_file.write_text(TENANTS)
    async with tenant_client(compat_redis.url, tenants_file) as client:
        await _isolated(client)


async def _isolated(as_tenant: httpx.AsyncClient) -> None:
    alice = {"Authorization": "Bearer alice-key-0123456789"}
    bob = {"X-API-KEY": "bob-key-0123456789"}  # the E2B SDK's header
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
