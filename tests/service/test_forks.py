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
from sandbox_service.broker.session_store import SessionStore
from sandbox_service.local.redis_server import RedisServer
from sandbox_service.settings import Settings
from tests.service.stack import Stack, api_with_tenants, stack_env
from tests.service.test_api import execute
from tests.service.test_sessions import internal


def recorded(client: redis.Redis, queue: str, session: str) -> int:
    """Cells a restore of `session` would replay (its chain by reference, then its own)."""
    store = SessionStore(client, queue, ttl_s=600, dead_after_s=5.0)
    return len(store.state(internal(session), -1).history or ())


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
    # Each fork has the parent's two cells recorded (by reference), and its own after them.
    assert recorded(redis_client, stack.queue, mine) == 2
    assert not redis_client.exists(keys.session_cells(stack.queue, internal(mine)))
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
    assert recorded(redis_client, stack.queue, mine) == 4
    assert redis_client.llen(keys.session_cells(stack.queue, internal(mine))) == 2
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


async def test_forks_store_the_parents_cells_once_and_no_script_copies_them(
    client: httpx.AsyncClient, stack: Stack, redis_client: redis.Redis
) -> None:
    parent = f"parent-{uuid.uuid4().hex}"
    size = 700 << 10  # stdin under the test stack's body bound, recorded with the cell
    response = await client.post(
        "/execute",
        json={"code": "import sys\nx = len(sys.stdin.read())", "session_id": parent,
              "stdin": "a" * size},
    )  # fmt: skip
    assert response.status_code == 200 and response.json()["status"] == "ok", response.text
    before = int(redis_client.info("memory")["used_memory"])
    forks = await fork(client, parent, 32)
    grown = int(redis_client.info("memory")["used_memory"]) - before
    # Copied, the 32 forks would add 32 records of 0.7 MB; by reference, a few keys each.
    assert grown < 2 << 20, f"Redis grew {grown} bytes for 32 forks of a 0.7 MB record"
    assert (await cell(client, forks[-1], "x"))["stdout"] == f"{size}\n"
    for session in (parent, *forks):
        assert (await client.delete(f"/sessions/{session}")).status_code == 204


async def test_a_fork_of_a_fork_is_rebuilt_from_the_chain_after_its_ancestors_end(
    client: httpx.AsyncClient, stack: Stack, redis_client: redis.Redis
) -> None:
    parent = f"parent-{uuid.uuid4().hex}"
    await cell(client, parent, "trail = ['parent']")
    (child,) = await fork(client, parent, 1)
    await cell(client, parent, "trail.append('parent later')")
    await cell(client, child, "trail.append('child')")
    (grandchild,) = await fork(client, child, 1)
    await cell(client, child, "trail.append('child later')")
    await cell(client, grandchild, "trail.append('grandchild')")
    for ancestor in (parent, child):
        assert (await client.delete(f"/sessions/{ancestor}")).status_code == 204
    lost = await execute(client, code="while True: pass", session_id=grandchild, timeout=0.5)
    assert lost["status"] == "timeout"  # its interpreter is gone: the next cell replays
    rebuilt = await cell(client, grandchild, "trail")
    assert rebuilt["restored"] is True
    assert rebuilt["stdout"] == "['parent', 'child', 'grandchild']\n"
    assert recorded(redis_client, stack.queue, grandchild) == 4  # with the last cell
    assert (await client.delete(f"/sessions/{grandchild}")).status_code == 204


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
    api_env = {"RL_SANDBOX_TENANTS_FILE": str(tenants)}
    yield from api_with_tenants(env, api_env, logs_dir / "forks-tenants.log")


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


AT_FORK = """
import os, subprocess, sys
ran = []
def daemon():
    ran.append('child')
    hold = 'b = bytearray(256 << 20); import time; time.sleep(600)'
    subprocess.Popen([sys.executable, '-c', hold])
os.register_at_fork(
    before=lambda: ran.append('before'),
    after_in_parent=lambda: ran.append('parent'),
    after_in_child=daemon,
)
"""
OTHERS = """
import os
me = os.getpid()
print(ran, [p for p in os.listdir('/proc') if p.isdigit() and int(p) != me])
"""


async def test_a_forks_at_fork_handlers_never_run_and_nothing_outlives_it(
    client: httpx.AsyncClient,
) -> None:
    # Issue 35: a handler that started a daemon holding 256 MiB at the fork left it running.
    parent = f"parent-{uuid.uuid4().hex}"
    await cell(client, parent, AT_FORK)
    (child,) = await fork(client, parent, 1)
    assert (await cell(client, parent, OTHERS))["stdout"] == "[] []\n"
    assert (await cell(client, child, OTHERS))["stdout"] == "[] []\n"
    for session in (parent, child):
        assert (await client.delete(f"/sessions/{session}")).status_code == 204


READ_SIBLING = """
import os
me, seen = os.getpid(), []
for pid in range(2, 4096):
    if pid != me:
        try:
            with open(f'/proc/{pid}/mem', 'rb') as mem:
                mem.seek(address)
                seen.append(mem.read(len(secret)))
        except OSError:
            pass
print(seen)
"""


async def test_a_fork_made_dumpable_is_no_siblings_to_read(client: httpx.AsyncClient) -> None:
    # Issue 35: a member that made itself dumpable again had its memory read by a sibling
    # through /proc/<pid>/mem (one rollout reading another's state).
    parent = f"parent-{uuid.uuid4().hex}"
    setup = "import ctypes\nsecret = bytearray(b'parent-state!')\n"
    await cell(
        client, parent, setup + "address = ctypes.addressof(ctypes.c_char.from_buffer(secret))"
    )
    (child,) = await fork(client, parent, 1)
    await cell(
        client, child, "secret[:] = b'forks-state!!'\nctypes.CDLL(None).prctl(4, 1, 0, 0, 0)"
    )
    assert (await cell(client, parent, READ_SIBLING))["stdout"] == "[]\n"
    # The member ended is rebuilt from its records at its next cell.
    again = await cell(client, child, "print(secret)")
    assert again["stdout"] == "bytearray(b'forks-state!!')\n" and again["restored"] is True
    for session in (parent, child):
        assert (await client.delete(f"/sessions/{session}")).status_code == 204
