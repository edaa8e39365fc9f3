"""A group belongs to its tenant (API.md, Groups): through the tenancy seam, an API process's
dispatcher on a real Redis (no worker, so the calls stay queued) sees another tenant's group
name as absent, and cancelling one tenant's group leaves the other's same-named group alone."""

from __future__ import annotations

import asyncio

import pytest
import redis

from sandbox_service import keys
from sandbox_service.api.context import to_payload
from sandbox_service.api.dispatch import Dispatcher
from sandbox_service.local.redis_server import RedisServer
from sandbox_service.settings import Settings
from sandbox_service.tenancy import Tenant, scoped, tenant_var
from trainer_client.wire import ExecuteRequest

pytestmark = pytest.mark.slow

ALICE, BOB = Tenant("alice"), Tenant("bob")


async def test_a_tenant_cannot_see_or_cancel_another_tenants_group(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    settings = Settings(redis_url=redis_server.url, queue_name="rlst-group-tenancy")
    dispatcher = Dispatcher(settings)
    await dispatcher.start()
    try:

        def submit(tenant: Tenant) -> asyncio.Future[list[dict[str, object]]]:
            token = tenant_var.set(tenant)
            try:
                payload = to_payload(ExecuteRequest(code="print(1)", group="g"))
            finally:
                tenant_var.reset(token)
            return asyncio.ensure_future(dispatcher.submit([payload]))

        alices, bobs = submit(ALICE), submit(BOB)
        queue = keys.rq_queue(settings.queue_name)
        for _ in range(100):
            if redis_client.llen(queue) == 2:
                break
            await asyncio.sleep(0.02)
        assert redis_client.llen(queue) == 2

        assert await dispatcher.cancel_group(scoped(Tenant("carol"), "g")) is None
        done = await dispatcher.cancel_group(scoped(ALICE, "g"))
        assert done is not None and done.cancelled == 1
        ((result,),) = [await asyncio.wait_for(alices, 10)]
        assert result["status"] == "cancelled", result
        await asyncio.sleep(0.2)
        assert not bobs.done()
        assert redis_client.llen(queue) == 1  # bob's call still waits for a worker
        done = await dispatcher.cancel_group(scoped(BOB, "g"))
        assert done is not None and done.cancelled == 1
        ((result,),) = [await asyncio.wait_for(bobs, 10)]
        assert result["status"] == "cancelled" and "never ran" in str(result["stderr"])
    finally:
        await dispatcher.stop()
