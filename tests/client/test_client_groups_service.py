"""Groups and deadlines from the client, against the real service: a group scope that exits
with an exception cancels its calls and session, the cancelled calls come back `cancelled` (not
retried) and are counted as infrastructure in the client's stats; the sync client is the twin."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from service_process import Service

from trainer_client import SandboxClient, SyncSandboxClient

pytestmark = pytest.mark.slow

SLEEP = "import time\nprint('started', flush=True)\ntime.sleep(15)"


class RolloutAborted(Exception):
    pass


async def test_a_group_scope_cancels_its_calls_when_the_rollout_fails(service: Service) -> None:
    name = f"step1/p{uuid.uuid4().hex[:6]}"
    async with SandboxClient(service.url) as client:
        calls: list[asyncio.Future[object]] = []
        with pytest.raises(RolloutAborted):
            async with client.group(name) as group:
                session = group.session()
                assert (await session.run("x = 1")).status == "ok"
                calls = [asyncio.ensure_future(group.execute(SLEEP, timeout=25)) for _ in range(4)]
                calls.append(asyncio.ensure_future(session.run(SLEEP, timeout=25)))
                await asyncio.sleep(1.5)
                raise RolloutAborted
        assert group.cancelled is not None and group.cancelled.cancelled == 5
        assert group.cancelled.sessions == 1
        results = await asyncio.wait_for(asyncio.gather(*calls), 10)
        assert [r.status for r in results] == ["cancelled"] * 5  # type: ignore[attr-defined]
        stats = client.stats()
        assert stats.infrastructure == {"cancelled": 5}
        assert stats.retries == 0
        after = await client.execute("print(x)", session_id=session.id)
        assert after.status == "error" and "NameError" in after.stderr
        assert await client.cancel_group(f"never-{uuid.uuid4().hex}") is None
        late = await client.execute(SLEEP, timeout=25, deadline_s=1.0)
        assert late.status == "deadline_exceeded" and late.stdout == "started\n"


def test_the_sync_group_scope_is_the_twin(service: Service) -> None:
    name = f"sync/{uuid.uuid4().hex[:6]}"
    with SyncSandboxClient(service.url) as client:
        with client.group(name) as group:
            assert group.execute("print(3)").stdout == "3\n"
        assert group.cancelled is None  # a normal exit cancels nothing
        answer = client.cancel_group(name)
        assert answer is not None and answer.cancelled == 0
        with pytest.raises(RolloutAborted), client.group(name) as group:
            raise RolloutAborted
        assert group.cancelled is not None and group.cancelled.group == name


async def test_trl_reward_gives_no_reward_to_rollouts_that_met_the_infrastructure(
    service: Service,
) -> None:
    from trainer_client.integrations.clients import ServiceAddress
    from trainer_client.integrations.reward import close_clients, grade_or_none

    address = ServiceAddress(service.url, None)
    responses = ["so \\boxed{4}", "so \\boxed{4}", "so \\boxed{5}", "no answer"]
    try:
        scores = await grade_or_none(
            responses, ["4"] * 4, address=address, infrastructure=[False, True, False, False]
        )
    finally:
        await close_clients()
    assert scores == [1.0, None, 0.0, 0.0]
