"""The client against the real service: Redis, RQ workers, nsjail, the HTTP API (conftest.py)."""

from __future__ import annotations

import asyncio
import base64
import random
import signal
import threading
from collections.abc import Callable

import httpx
import pytest
from fault_transport import FaultInjectingTransport, connect_error, drop, slow, status
from service_process import Service

from sandbox_service.local.procs import free_port
from trainer_client import (
    DeadlineExceededError,
    ExecuteResult,
    InvalidRequestError,
    RetryPolicy,
    SandboxClient,
    SyncSandboxClient,
    VirtualClock,
    execute_tool_call,
    parse_tool_calls,
)

pytestmark = pytest.mark.slow


async def test_results_come_back_in_order_with_the_programs_statuses(service: Service) -> None:
    requests: list[dict[str, object]] = [{"code": f"print({i} * {i})"} for i in range(20)]
    requests[5] = {"code": "1/0"}
    requests[9] = {"code": "import sys; sys.exit(3)"}
    requests[12] = {"code": "print(input()[::-1])", "stdin": "abc\n"}
    requests[15] = {"code": "while True: pass", "timeout": 1}
    async with SandboxClient(service.url) as client:
        results = await client.execute_many(requests)
        stats = client.stats()
    assert results[5].status == "error" and "ZeroDivisionError" in results[5].stderr
    assert results[9].status == "error" and results[9].exit_code == 3
    assert results[12].status == "ok" and results[12].stdout == "cba\n"
    assert results[15].status == "timeout"
    plain = [i for i in range(20) if i not in (5, 9, 12, 15)]
    assert [results[i].stdout for i in plain] == [f"{i * i}\n" for i in plain]
    assert stats.retries == 0 and stats.results == 20


async def test_concurrent_rollouts_are_micro_batched(service: Service) -> None:
    async def rollout(r: int, client: SandboxClient) -> list[str]:
        outputs = []
        for turn in range(4):  # each turn waits for the previous tool response, as a rollout does
            result = await client.execute(f"print({r} * 100 + {turn})")
            outputs.append(result.stdout)
        return outputs

    async with SandboxClient(service.url) as client:
        outputs = await asyncio.gather(*(rollout(r, client) for r in range(32)))
        stats = client.stats()
    assert outputs == [[f"{r * 100 + t}\n" for t in range(4)] for r in range(32)]
    assert stats.results == 128
    assert stats.http_requests < 128 and stats.mean_batch_size > 1


async def test_an_invalid_item_fails_alone(service: Service) -> None:
    requests: list[dict[str, object]] = [{"code": f"print({i})"} for i in range(10)]
    requests[4] = {"code": "print(4)", "timeout": 100_000}  # over the server's max_timeout
    async with SandboxClient(service.url) as client:
        outcomes = await client.execute_many(requests, return_exceptions=True)
    error = outcomes[4]
    assert isinstance(error, InvalidRequestError) and "timeout" in str(error)
    assert "call #5" in str(error)
    others = [o for i, o in enumerate(outcomes) if i != 4]
    assert all(isinstance(o, ExecuteResult) for o in others)
    assert [o.stdout for o in others if isinstance(o, ExecuteResult)] == [
        f"{i}\n" for i in range(10) if i != 4
    ]


async def test_files_go_in_and_come_back(service: Service) -> None:
    code = "data = open('in.txt').read()\nopen('out.txt', 'w').write(data.upper())\n"
    async with SandboxClient(service.url) as client:
        result = await client.execute(code, files={"in.txt": b"hello"}, fetch_files=["out.txt"])
    assert result.status == "ok", result.stderr
    assert base64.b64decode(result.files["out.txt"]) == b"HELLO"


async def test_a_rollout_turn_end_to_end(service: Service) -> None:
    turn = (
        "<reason> Compute it. </reason>\n<tool_call>\n"
        '{"name": "python_code_with_standard_io", "arguments": '
        '{"code": "n = int(input())\\nprint(sum(range(n + 1)))", "input": "100\\n"}}'
        "\n</tool_call>"
    )
    [call] = parse_tool_calls(turn)
    async with SandboxClient(service.url) as client:
        text = await execute_tool_call(client, call, timeout=4)
    lines = text.splitlines()
    assert lines[:2] == ["Tool call success", "stdout: 5050"]
    assert lines[-1].startswith("execution time: ") and lines[-1].endswith("s")


def test_the_sync_facade_serves_several_threads(service: Service) -> None:
    outputs: dict[int, list[str]] = {}
    with SyncSandboxClient(service.url) as client:

        def worker(t: int) -> None:
            outputs[t] = [client.execute(f"print({t}, {i})").stdout for i in range(5)]

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        many = client.execute_many([{"code": "print('a')"}, {"code": "print('b')"}])
        stats = client.stats()
    assert outputs == {t: [f"{t} {i}\n" for i in range(5)] for t in range(4)}
    assert [r.stdout for r in many] == ["a\n", "b\n"]
    assert stats.results == 22


async def test_injected_faults_in_front_of_the_real_service(service: Service) -> None:
    clock = VirtualClock()
    faults = [drop(), connect_error(), status(503), slow(30), drop()]
    transport = FaultInjectingTransport(httpx.AsyncHTTPTransport(), faults, clock)
    async with SandboxClient(
        service.url, transport=transport, clock=clock, rng=random.Random(0), max_wait_s=0.02
    ) as client:
        results = await client.execute_many([{"code": f"print({i})"} for i in range(40)])
        stats = client.stats()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(40)]
    assert stats.failures == 0 and stats.retries >= len(faults)


async def test_the_deadline_ends_a_call_the_service_is_still_running(service: Service) -> None:
    policy = RetryPolicy(deadline_s=0.5)
    async with SandboxClient(service.url, retry=policy) as client:
        with pytest.raises(DeadlineExceededError, match=r"call #1 \(code='import time"):
            await client.execute("import time; time.sleep(2)", timeout=5)


async def test_the_deadline_ends_calls_to_a_service_that_is_down() -> None:
    policy = RetryPolicy(deadline_s=1.0, wait_initial_s=0.05, wait_max_s=0.2, attempts=1000)
    async with SandboxClient(f"http://127.0.0.1:{free_port()}", retry=policy) as client:
        with pytest.raises(DeadlineExceededError) as caught:
            await client.execute("print(1)")
    assert "ConnectError" in caught.value.last_error and caught.value.attempts > 1


async def test_429_from_a_tiny_queue_bound_is_waited_out(
    own_service: Callable[..., Service],
) -> None:
    small = own_service(max_queue_depth="2", retry_after_s="1")
    policy = RetryPolicy(deadline_s=120)
    # One full batch of 8 first, whatever the load on this machine: 8 > 2 is refused for sure.
    async with SandboxClient(small.url, retry=policy, max_batch_size=8, max_wait_s=0.5) as client:
        codes = [f"import time; time.sleep(0.05); print({i})" for i in range(8)]
        results = await client.execute_many([{"code": c} for c in codes])
        stats = client.stats()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)]
    assert stats.http_failures.get("429", 0) >= 1 and stats.retry_causes.get("429", 0) >= 1
    assert stats.failures == 0


async def test_every_call_is_answered_across_a_service_crash_and_restart(
    own_service: Callable[..., Service],
) -> None:
    running = own_service()
    calls, rollouts = 1200, 120
    crash_after = 300
    done = 0
    crashed = asyncio.Event()
    policy = RetryPolicy(attempts=100, deadline_s=300, wait_max_s=0.5)

    async def rollout(r: int, client: SandboxClient) -> list[tuple[int, ExecuteResult]]:
        nonlocal done
        answered = []
        for i in range(r, calls, rollouts):
            answered.append((i, await client.execute(f"print({i} * 7)")))
            done += 1
            if done == crash_after:
                crashed.set()
        return answered

    async def crash_and_restart() -> None:
        await crashed.wait()
        # SIGKILL: the API and the workers die mid-request, as on a machine failure.
        await asyncio.to_thread(running.stop, signal.SIGKILL)
        await asyncio.to_thread(running.start)

    async with SandboxClient(running.url, retry=policy) as client:
        restart = asyncio.ensure_future(crash_and_restart())
        per_rollout = await asyncio.gather(*(rollout(r, client) for r in range(rollouts)))
        await restart
        stats = client.stats()
    answered = dict(pair for answers in per_rollout for pair in answers)
    assert sorted(answered) == list(range(calls))
    wrong = {i: (r.status, r.stdout) for i, r in answered.items() if r.stdout != f"{i * 7}\n"}
    assert wrong == {}
    assert stats.failures == 0
    assert stats.retry_causes.get("ConnectError", 0) > 0  # it was really down for a while


async def test_a_session_keeps_state_until_ended(service: Service) -> None:
    async with SandboxClient(service.url) as client:
        first = await client.execute("total = 40", session_id="client-session")
        second = await client.execute("total + 2", session_id="client-session")
        assert (first.status, second.stdout) == ("ok", "42\n")
        assert await client.end_session("client-session") is True
        assert await client.end_session("client-session") is False
        fresh = await client.execute("'total' in globals()", session_id="client-session")
    assert fresh.stdout == "False\n"


def test_the_sync_facade_ends_sessions(service: Service) -> None:
    with SyncSandboxClient(service.url) as client:
        client.execute("x = 1", session_id="sync-session")
        assert client.end_session("sync-session") is True
        assert client.end_session("never-started") is False


async def test_verify_judges_answers_in_the_real_service(service: Service) -> None:
    # A connection refused first: the retried POST is the one the service answers.
    transport = FaultInjectingTransport(httpx.AsyncHTTPTransport(), [connect_error()])
    async with SandboxClient(
        service.url, transport=transport, clock=VirtualClock(), rng=random.Random(0)
    ) as client:
        results = await client.verify(
            [("\\frac{1}{2}", "0.5"), ("3", "4"), ("", "1"), ("x^2 + 2x + 1", "(x+1)^2")],
            timeout=5.0,
        )
    assert [(r.verdict, r.reason) for r in results] == [
        ("correct", "equivalent"),
        ("incorrect", "not_equivalent"),
        ("invalid", "empty_answer"),
        ("correct", "equivalent"),
    ]
    assert all(r.judged for r in results) and len(transport.requests) == 2
