"""Forked sessions through the real service: copies of a session's state that live apart."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from sandbox_service import keys
from sandbox_service.local.redis_server import RedisServer
from sandbox_service.settings import Settings
from tests.service.stack import Stack, spawn, stack_env, stop
from tests.service.test_api import execute
from tests.service.test_sessions import internal


async def cell(client: httpx.AsyncClient, session: str, code: str) -> dict[str, object]:
    result = await execute(client, code=code, session_id=session)
    assert result["status"] == "ok", result
    return result


async def fork(client: httpx.AsyncClient, session: str, n: int) -> list[str]:
    response = await client.post(f"/sessions/{session}/fork", json={"n": n})
    assert response.status_code == 200, response.text
    forks: list[str] = response.json()["session_ids"]
    assert len(forks) == len(set(forks)) == n
    return forks


async def test_forks_copy_the_state_then_live_apart(
    client: httpx.AsyncClient, stack: Stack, redis_client: redis.Redis
) -> None:
    parent = f"parent-{uuid.uuid4().hex}"
    await cell(client, parent, "import fractions\nx = 41\nopen('data.txt', 'w').write('parent')")
    await cell(client, parent, "open('/tmp/t.txt', 'w').write('tmp')\ny = fractions.Fraction(1, 3)")
    mine, sibling, third = await fork(client, parent, 3)
    # Each fork has the parent's two cells recorded, and its own after them.
    assert redis_client.llen(keys.session_cells(stack.queue, internal(mine))) == 2
    first = await cell(
        client,
        mine,
        "print(x + 1, y, open('data.txt').read(), open('/tmp/t.txt').read())\n"
        "x = 'mine'\nopen('data.txt', 'w').write('mine')\nopen('/tmp/only-mine', 'w').write('')\n"
        "None",
    )
    # A live copy of the parent's interpreter: nothing was replayed.
    assert first["stdout"] == "42 1/3 parent tmp\n" and first["restored"] is False
    await cell(client, parent, "x = 0\nopen('data.txt', 'w').write('parent later')")
    # Neither a sibling's later state and files nor the parent's reach a fork, and back.
    probe = "import os\nprint(x, open('data.txt').read(), os.path.exists('/tmp/only-mine'))"
    assert (await cell(client, sibling, probe))["stdout"] == "41 parent False\n"
    assert (await cell(client, parent, probe))["stdout"] == "0 parent later False\n"
    assert (await cell(client, mine, probe))["stdout"] == "mine mine True\n"
    assert redis_client.llen(keys.session_cells(stack.queue, internal(mine))) == 4
    # Each ends on its own: the others live on.
    assert (await client.delete(f"/sessions/{mine}")).status_code == 204
    assert (await client.delete(f"/sessions/{parent}")).status_code == 204
    assert (await cell(client, sibling, "x"))["stdout"] == "41\n"
    assert (await cell(client, third, "x"))["stdout"] == "41\n"
    # A fork of a fork copies the fork.
    (grandchild,) = await fork(client, sibling, 1)
    assert (await cell(client, grandchild, "y * 3"))["stdout"] == "Fraction(1, 1)\n"
    for session in (sibling, third, grandchild):
        assert (await client.delete(f"/sessions/{session}")).status_code == 204
    assert (await client.post(f"/sessions/{mine}/fork", json={"n": 1})).status_code == 404


async def test_a_fork_of_a_session_not_live_is_rebuilt_from_its_records(
    client: httpx.AsyncClient,
) -> None:
    parent = f"parent-{uuid.uuid4().hex}"
    await cell(client, parent, "x = 41")
    lost = await execute(client, code="while True: pass", session_id=parent, timeout=0.5)
    assert lost["status"] == "timeout"  # its interpreter is gone; its records stay
    (child,) = await fork(client, parent, 1)
    first = await cell(client, child, "x + 1")
    assert first["stdout"] == "42\n" and first["restored"] is True
    for session in (parent, child):
        assert (await client.delete(f"/sessions/{session}")).status_code == 204


async def test_a_fork_killed_by_a_sibling_is_rebuilt_with_its_own_cells(
    client: httpx.AsyncClient,
) -> None:
    parent = f"parent-{uuid.uuid4().hex}"
    await cell(client, parent, "import os, signal\nx = [1]")
    victim, attacker = await fork(client, parent, 2)
    await cell(client, victim, "x.append('victim')")
    kill_all = (
        # Siblings are hidden in /proc (non-dumpable, hidepid): their pids are guessed.
        "for p in range(2, 4096):\n"
        "    if p != os.getpid():\n"
        "        try:\n            os.kill(p, signal.SIGKILL)\n"
        "        except OSError:\n            pass"
    )
    await cell(client, attacker, kill_all)
    # The victim's state comes back from its records: the parent's cell, then its own.
    rebuilt = await cell(client, victim, "x")
    assert rebuilt["stdout"] == "[1, 'victim']\n" and rebuilt["restored"] is True
    assert (await cell(client, parent, "x"))["stdout"] == "[1]\n"
    for session in (parent, victim, attacker):
        assert (await client.delete(f"/sessions/{session}")).status_code == 204


async def test_fork_files_given_by_the_parent_cells_are_copied(client: httpx.AsyncClient) -> None:
    parent = f"parent-{uuid.uuid4().hex}"
    data = base64.b64encode(b"\x00\x01uploaded").decode()
    response = await client.post(
        "/execute", json={"code": "pass", "session_id": parent, "files": {"in.bin": data}}
    )
    assert response.json()["status"] == "ok"
    (child,) = await fork(client, parent, 1)
    result = await execute(client, code="open('in.bin', 'rb').read()", session_id=child)
    assert result["stdout"] == "b'\\x00\\x01uploaded'\n"
    for session in (parent, child):
        await client.delete(f"/sessions/{session}")


async def test_bad_forks_are_refused_naming_the_field(client: httpx.AsyncClient) -> None:
    parent = f"parent-{uuid.uuid4().hex}"
    await cell(client, parent, "x = 1")
    bound = Settings().max_fork_n
    for body in ({"n": 0}, {"n": bound + 1}, {"n": "many"}, {"n": -3}, {}):
        response = await client.post(f"/sessions/{parent}/fork", json=body)
        assert response.status_code == 422, (body, response.text)
        assert any(e["loc"][:2] == ["body", "n"] for e in response.json()["detail"]), body
    response = await client.post(f"/sessions/{parent}/fork", json={"n": 1, "ttl": 5})
    assert response.status_code == 422 and "ttl" in response.text
    assert (await client.post(f"/sessions/{'x' * 257}/fork", json={"n": 1})).status_code == 422
    unknown = await client.post(f"/sessions/never-{uuid.uuid4().hex}/fork", json={"n": 2})
    assert unknown.status_code == 404
    assert (await client.delete(f"/sessions/{parent}")).status_code == 204
    assert (await client.post(f"/sessions/{parent}/fork", json={"n": 1})).status_code == 404


@pytest.fixture(scope="module")
def two_keys_api(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    """A stack of its own (the tenants an API publishes are the ones its queue's workers
    serve) whose API has two tenants' keys; one worker, which learns them from Redis."""
    tenants = logs_dir / "forks-tenants.toml"
    tenants.write_text(
        '[[tenant]]\nname = "alice"\nkey = "alice-key"\n\n'
        '[[tenant]]\nname = "bob"\nkey = "bob-key"\n'
    )
    env = stack_env(redis_server.url, "forks-tenants", 63800, workers=1)
    log = logs_dir / "forks-tenants.log"
    workers = spawn(["worker"], env, log)
    api = Stack({**env, "RL_SANDBOX_TENANTS_FILE": str(tenants)}, log, workers=False)
    try:
        yield api.start()
    finally:
        api.stop()
        stop(workers)


async def test_another_key_can_neither_fork_nor_see_nor_end_a_session_or_its_forks(
    two_keys_api: Stack,
) -> None:
    alice = httpx.AsyncClient(
        base_url=two_keys_api.url, timeout=60, headers={"Authorization": "Bearer alice-key"}
    )
    bob = httpx.AsyncClient(
        base_url=two_keys_api.url, timeout=60, headers={"Authorization": "Bearer bob-key"}
    )
    async with alice, bob:
        parent = f"parent-{uuid.uuid4().hex}"
        await cell(alice, parent, "secret = 'alice'")
        (child,) = await fork(alice, parent, 1)
        for session in (parent, child):
            # Bob cannot fork, end, or reach the state of Alice's session or fork...
            assert (await bob.post(f"/sessions/{session}/fork", json={"n": 1})).status_code == 404
            assert (await bob.delete(f"/sessions/{session}")).status_code == 404
            seen = await execute(bob, code="'secret' in globals()", session_id=session)
            assert seen["stdout"] == "False\n"  # ...his own id names his own, new session
            assert (await bob.delete(f"/sessions/{session}")).status_code == 204
        assert (await cell(alice, child, "secret"))["stdout"] == "'alice'\n"
        for session in (parent, child):
            assert (await alice.delete(f"/sessions/{session}")).status_code == 204
