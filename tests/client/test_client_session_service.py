"""Session objects, file helpers, fork safety and clean shutdown, against the real service."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import multiprocessing.connection
import threading
import warnings
from typing import Any

import psutil
import pytest
from service_process import Service

from trainer_client import (
    ClientClosedError,
    InvalidRequestError,
    RetryPolicy,
    SandboxClient,
    SandboxClientError,
    SyncSandboxClient,
)

pytestmark = pytest.mark.slow

FORK = multiprocessing.get_context("fork")
# Forking a process that has threads (the sync client's loop thread, the test's own) is exactly
# the reward-worker case under test; Python 3.12 warns about it in general.
forks_with_threads = pytest.mark.filterwarnings("ignore:This process .* fork:DeprecationWarning")


def connections_to(port: int) -> set[int]:
    """Local ports of this process's established TCP connections to `port`."""
    return {
        c.laddr.port
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    }


async def test_a_session_keeps_state_and_its_block_ends_it(service: Service) -> None:
    async with SandboxClient(service.url) as client:
        async with client.session() as session:
            await session.run("x = 41")
            shown = await session.run("x + 1")
        assert shown.stdout == "42\n"
        assert session.closed
        with pytest.raises(ClientClosedError):
            await session.run("x")
        # Gone on the service: nothing to end, and the same id starts an empty interpreter.
        assert await client.end_session(session.id) is False
        fresh = await client.execute("x", session_id=session.id)
        assert fresh.status == "error" and fresh.error and fresh.error.ename == "NameError"
        await client.end_session(session.id)


async def test_a_block_that_raises_still_ends_its_session(service: Service) -> None:
    async with SandboxClient(service.url) as client:
        with pytest.raises(ZeroDivisionError):
            async with client.session("traj-raises") as session:
                await session.run("y = 1")
                raise ZeroDivisionError
        assert await client.end_session("traj-raises") is False


async def test_files_go_up_and_come_back_as_bytes(service: Service) -> None:
    payload = bytes(range(256)) * 4
    async with SandboxClient(service.url) as client, client.session() as session:
        await session.upload({"data/in.bin": payload})
        done = await session.run(
            "data = open('data/in.bin', 'rb').read()\n"
            "open('out.bin', 'wb').write(data[::-1])\n"
            "len(data)"
        )
        assert done.stdout == f"{len(payload)}\n"
        back = await session.download(["out.bin", "never-written.txt"])
    assert back == {"out.bin": payload[::-1]}


def test_the_sync_session_is_the_twin(service: Service) -> None:
    with SyncSandboxClient(service.url) as client:
        with client.session(timeout=5) as session:
            session.upload({"n.txt": b"6"})
            assert session.run("n = int(open('n.txt').read())").status == "ok"
            assert session.run("print(n * 7)").stdout == "42\n"
            session.run("open('r.txt', 'w').write(str(n))")
            assert session.download(["r.txt"]) == {"r.txt": b"6"}
        assert client.end_session(session.id) is False
        with pytest.raises(ClientClosedError):
            session.run("n")


def _child_runs_async(
    client: SandboxClient, port: int, conn: multiprocessing.connection.Connection
) -> None:
    """In the forked child: the parent's async client, used from the child's own loop."""
    inherited = connections_to(port)

    async def calls() -> list[str]:
        results = await asyncio.gather(*(client.execute(f"print('child', {i})") for i in range(8)))
        return [r.stdout for r in results]

    try:
        outputs = asyncio.run(calls())
        conn.send({"outputs": outputs, "new": sorted(connections_to(port) - inherited)})
    except BaseException as exc:
        conn.send({"error": repr(exc)})


@forks_with_threads
async def test_an_async_client_used_after_fork_opens_its_own_connections(
    service: Service,
) -> None:
    # A short deadline: without its own pool and loop task, the child's calls would wait here.
    async with SandboxClient(service.url, retry=RetryPolicy(deadline_s=30)) as client:
        await client.execute("print('warm')")
        parent_ports = connections_to(service.port)
        assert parent_ports, "the parent holds a pooled connection"
        ours, theirs = FORK.Pipe()
        child = FORK.Process(target=_child_runs_async, args=(client, service.port, theirs))
        child.start()
        try:
            # The parent keeps calling while the child does: answers must not cross.
            mine = await asyncio.gather(
                *(client.execute(f"print('parent', {i})") for i in range(8))
            )
            loop = asyncio.get_running_loop()
            report: dict[str, Any] = await loop.run_in_executor(None, _receive, ours)
            await loop.run_in_executor(None, child.join, 30)
        finally:
            _reap(child)
    assert "error" not in report, report
    assert report["outputs"] == [f"child {i}\n" for i in range(8)]
    assert [r.stdout for r in mine] == [f"parent {i}\n" for i in range(8)]
    assert report["new"] and not set(report["new"]) & parent_ports
    assert child.exitcode == 0


def _reap(child: Any) -> None:
    if child.is_alive():
        child.kill()
    child.join()


def _receive(conn: multiprocessing.connection.Connection) -> Any:
    if not conn.poll(60):
        raise AssertionError("the child sent nothing in 60 s")
    return conn.recv()


def _child_runs_sync(
    client: SyncSandboxClient, port: int, conn: multiprocessing.connection.Connection
) -> None:
    inherited = connections_to(port)
    try:
        outputs = [r.stdout for r in client.execute_many({"code": f"print({i})"} for i in range(4))]
        with client.session() as session:
            session.run("z = 5")
            outputs.append(session.run("z * 2").stdout)
        conn.send({"outputs": outputs, "new": sorted(connections_to(port) - inherited)})
        client.close()
    except BaseException as exc:
        conn.send({"error": repr(exc)})


@forks_with_threads
def test_a_sync_client_used_after_fork_works_in_the_child(service: Service) -> None:
    with SyncSandboxClient(service.url, retry=RetryPolicy(deadline_s=30)) as client:
        assert client.execute("print(1)").stdout == "1\n"
        ours, theirs = FORK.Pipe()
        child = FORK.Process(target=_child_runs_sync, args=(client, service.port, theirs))
        child.start()
        try:
            report = _receive(ours)
            child.join(30)
        finally:
            _reap(child)
        assert client.execute("print('parent still')").stdout == "parent still\n"
    assert "error" not in report, report
    assert report["outputs"] == ["0\n", "1\n", "2\n", "3\n", "10\n"]
    assert report["new"]
    assert child.exitcode == 0


def test_closing_leaves_no_socket_and_no_resource_warning(service: Service) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)

        async def use() -> None:
            async with SandboxClient(service.url) as client, client.session() as session:
                await asyncio.gather(*(client.execute(f"print({i})") for i in range(20)))
                await session.run("1")
                assert connections_to(service.port)

        asyncio.run(use())
        with SyncSandboxClient(service.url) as sync_client:
            sync_client.execute_many({"code": f"print({i})"} for i in range(20))
            with sync_client.session() as session:
                session.run("1")
        gc.collect()
    assert connections_to(service.port) == set()
    assert not [t for t in threading.enumerate() if t.name == "rl-sandbox-client"]


async def test_a_session_forks_into_independent_copies_and_seeds_reach_cells(
    service: Service,
) -> None:
    async with SandboxClient(service.url) as client:
        async with client.session() as session:
            await session.run("import random\nx = 41")
            forks = await session.fork(2)
            assert len({f.id for f in forks}) == 2 and session.id not in {f.id for f in forks}
            await forks[0].run("x = 'changed'")
            assert (await forks[1].run("x + 1")).stdout == "42\n"
            assert (await session.run("x + 1")).stdout == "42\n"
            draws = [await s.run("random.random()", seed=9) for s in (forks[1], session)]
            assert draws[0].stdout == draws[1].stdout
            for fork in forks:
                assert await fork.close() is True
        with pytest.raises(InvalidRequestError):
            await client.fork_session("any", 0)


def test_the_sync_session_forks(service: Service) -> None:
    with SyncSandboxClient(service.url) as client, client.session() as session:
        session.run("y = [1, 2]")
        (fork,) = session.fork(1)
        with fork:
            fork.run("y.append(3)")
            assert fork.run("y").stdout == "[1, 2, 3]\n"
        assert session.run("y").stdout == "[1, 2]\n"
        with pytest.raises(SandboxClientError, match="404"):
            client.fork_session(fork.id, 1)
