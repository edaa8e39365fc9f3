"""POST /grade on a real stack: the hack and honest corpora (grade_corpus.py), dataset samples,
infrastructure statuses, C++ and refused requests.

Every hack earns 0 and raises its audit key; every honest candidate earns 1.0. The same hacks
graded the naive way (candidate and asserts as one program through /execute, passed on exit 0)
show what the sealed route holds against: the count is printed (`pytest -s`), and
docs/security.md publishes it with the sealed numbers these tests assert.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox_service.local.redis_server import RedisServer
from tests.service.grade_corpus import HACKS, HONEST, Hack
from tests.service.grade_datasets import humaneval_requests, sample_requests
from tests.service.stack import Stack, stack_env

pytestmark = pytest.mark.timeout(900)

GRADE_LIMITS = {
    "max_batch": 256,
    "max_code_bytes": 65536,
    "max_output_bytes": 65536,
    "max_timeout": 20,
    "max_memory_mb": 2048,
}


@pytest.fixture(scope="module")
def grade_stack(redis_server: RedisServer, logs_dir: Path) -> Iterator[Stack]:
    """A stack whose batches hold a whole corpus."""
    env = stack_env(redis_server.url, "grade", 66500, **GRADE_LIMITS)
    running = Stack(env, logs_dir / "grade.log").start()
    yield running
    running.stop()


@pytest.fixture
async def client(grade_stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=grade_stack.url, timeout=900) as http:
        yield http


async def _grade(client: httpx.AsyncClient, requests: list[dict[str, Any]]) -> list[Any]:
    reply = await client.post("/grade/batch", json={"requests": requests}, timeout=900)
    assert reply.status_code == 200, reply.text
    results: list[Any] = reply.json()["results"]
    return results


def _unearned(hacks: tuple[Hack, ...], results: list[Any]) -> list[str]:
    problems = []
    for hack, result in zip(hacks, results, strict=True):
        if result["status"] != "graded" or result["reward"] != 0.0:
            problems.append(f"{hack.name}: {result['status']} reward {result['reward']}")
        if not result["audit"].get(hack.audit):
            problems.append(f"{hack.name}: audit {hack.audit} not counted: {result['audit']}")
    return problems


async def test_every_hack_earns_nothing_as_a_function_test(client: httpx.AsyncClient) -> None:
    assert len(HACKS) >= 40
    results = await _grade(client, [hack.function_request() for hack in HACKS])
    problems = _unearned(HACKS, results)
    print("\n".join(problems))
    assert problems == []


async def test_every_hack_earns_nothing_as_an_asserts_test(client: httpx.AsyncClient) -> None:
    results = await _grade(client, [hack.asserts_request() for hack in HACKS])
    problems = _unearned(HACKS, results)
    print("\n".join(problems))
    assert problems == []


async def test_every_honest_candidate_earns_full_reward(client: httpx.AsyncClient) -> None:
    assert len(HONEST) >= 40
    results = await _grade(client, [honest.request for honest in HONEST])
    failed = [
        f"{honest.name}: {result['status']} {result['reward']} "
        + "; ".join(f"{c['status']} {c['message']} {c['stderr'][-300:]}" for c in result["cases"])
        for honest, result in zip(HONEST, results, strict=True)
        if result["reward"] != 1.0
    ]
    assert failed == []


async def test_the_naive_concatenated_grading_falls_for_hacks(client: httpx.AsyncClient) -> None:
    programs = [
        {"code": hack.naive_program(), "timeout": hack.timeout, "memory_mb": 256} for hack in HACKS
    ]
    reply = await client.post("/execute/batch", json={"requests": programs}, timeout=900)
    assert reply.status_code == 200, reply.text
    fooled = [
        h.name for h, r in zip(HACKS, reply.json()["results"], strict=True) if r["status"] == "ok"
    ]
    print(f"naive: {len(fooled)} of {len(HACKS)} hacks pass: {fooled}")
    assert "sys_exit_0_at_load" in fooled


async def test_dataset_samples_earn_full_reward(client: httpx.AsyncClient) -> None:
    named = sample_requests()
    results = await _grade(client, [request for _, request in named])
    assert [name for (name, _), r in zip(named, results, strict=True) if r["reward"] != 1.0] == []


async def test_humaneval_canonical_solutions_earn_full_reward(client: httpx.AsyncClient) -> None:
    """Every eighth HumanEval problem (21 of 164, HumanEval/32's 200 calls among them) in
    make test; scripts/grade_datasets.py grades all of them."""
    named = humaneval_requests()
    assert len(named) == 164
    chosen = named[::8]
    results = await _grade(client, [request for _, request in chosen])
    assert [name for (name, _), r in zip(chosen, results, strict=True) if r["reward"] != 1.0] == []


async def test_an_infrastructure_status_carries_no_reward(client: httpx.AsyncClient) -> None:
    request = {**HONEST[0].request, "deadline_s": 0.000001}
    reply = await client.post("/grade", json=request)
    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert (result["status"], result["reward"]) == ("deadline_exceeded", None)


async def test_a_cpp_candidate_that_does_not_compile_fails_every_case(
    client: httpx.AsyncClient,
) -> None:
    tests = {"kind": "stdio", "cases": [{"stdin": "", "expected_stdout": "1"}] * 2}
    reply = await client.post(
        "/grade", json={"language": "cpp", "code": "int main( {", "tests": tests}
    )
    result = reply.json()
    assert (result["status"], result["reward"]) == ("graded", 0.0)
    assert [c["status"] for c in result["cases"]] == ["error", "error"]
    assert result["compile"]["status"] == "error"


async def test_bad_requests_are_refused_naming_the_field(client: httpx.AsyncClient) -> None:
    function = {"kind": "function", "entry_point": "f", "cases": [{"args": [], "expected": 1}]}
    cpp = await client.post("/grade", json={"language": "cpp", "code": "", "tests": function})
    assert cpp.status_code == 422
    assert cpp.json()["detail"][0]["loc"] == ["body", "tests", "kind"]
    name = {**function, "entry_point": "not a name"}
    assert (await client.post("/grade", json={"code": "", "tests": name})).status_code == 422
    many = {"kind": "asserts", "asserts": ["assert True"] * 1000}
    too_many = await client.post("/grade", json={"code": "", "tests": many})
    assert too_many.json()["detail"][0]["loc"] == ["body", "tests", "asserts"]
    unknown = await client.post("/grade", json={"code": "", "tests": function, "x": 1})
    assert unknown.status_code == 422
    slow = await client.post("/grade", json={"code": "", "tests": function, "timeout": 99})
    assert slow.json()["detail"][0]["loc"] == ["body", "timeout"]
