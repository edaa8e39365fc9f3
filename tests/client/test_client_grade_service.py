"""SandboxClient.grade and verl's code reward (integrations/code_reward.py) against the real
service; the reward's mapping of datasets' fields."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
import pytest
from fault_transport import FaultInjectingTransport, status
from service_process import Service

from trainer_client import GradeRequest, RetryPolicy, SandboxClient, SyncSandboxClient
from trainer_client.integrations.clients import close_shared_sync_clients
from trainer_client.integrations.code_reward import (
    close_clients,
    compute_score,
    compute_score_batch,
    grade_request,
)

pytestmark = pytest.mark.slow

FUNCTION = {
    "kind": "function",
    "entry_point": "solve",
    "cases": [{"args": [2, 3], "expected": 7}, {"args": [4, 5], "expected": 21}],
}


async def test_grades_come_back_in_order(service: Service) -> None:
    requests: list[GradeRequest | dict[str, object]] = [
        {"code": "def solve(a, b):\n    return a * b + 1\n", "tests": FUNCTION},
        {"code": "import sys\nsys.exit(0)\n", "tests": FUNCTION},
        GradeRequest.model_validate(
            {
                "code": "def solve(a, b):\n    return a * b + 1\n",
                "tests": {"kind": "asserts", "asserts": ["assert solve(2, 3) == 7"]},
            }
        ),
    ]
    async with SandboxClient(service.url) as client:
        results = await client.grade(requests)
    assert [(r.status, r.reward) for r in results] == [
        ("graded", 1.0),
        ("graded", 0.0),
        ("graded", 1.0),
    ]
    assert results[1].audit["early_exits"] == 2


async def test_a_refused_post_is_sent_again(service: Service) -> None:
    transport = FaultInjectingTransport(httpx.AsyncHTTPTransport(), [status(503)])
    retry = RetryPolicy(attempts=3, wait_initial_s=0.01, wait_jitter_s=0.0)
    async with SandboxClient(
        service.url, transport=transport, retry=retry, rng=random.Random(0)
    ) as client:
        (result,) = await client.grade([{"code": "def solve(a, b): return 0", "tests": FUNCTION}])
    assert (result.status, result.reward) == ("graded", 0.0)
    assert len(transport.requests) == 2


def test_the_sync_client_grades(service: Service) -> None:
    with SyncSandboxClient(service.url) as client:
        (result,) = client.grade(
            [{"code": "print(6)", "tests": {"kind": "stdio", "cases": [{"expected_stdout": "6"}]}}]
        )
    assert result.reward == 1.0


RIGHT = "```python\ndef solve(a, b):\n    return a * b + 1\n```"
EXITS = "Done:\n```python\nimport sys\nsys.exit(0)\n```"
TRUTHS: dict[str, Any] = {
    "apps_stdio": {"inputs": ["2 3\n", "4 5\n"], "outputs": ["7\n", "21\n"]},
    "apps_fn_name": {"inputs": [[2, 3], [4, 5]], "outputs": [[7], [21]], "fn_name": "solve"},
    "mbpp": {"test_list": ["assert solve(2, 3) == 7"], "test_setup_code": ""},
    "humaneval": {
        "test": "def check(candidate):\n    assert candidate(4, 5) == 21\n",
        "entry_point": "solve",
    },
}
STDIO_RIGHT = "```python\na, b = map(int, input().split())\nprint(a * b + 1)\n```"


def test_dataset_fields_map_to_the_services_tests() -> None:
    kinds = {name: grade_request(RIGHT, truth).tests.kind for name, truth in TRUTHS.items()}
    assert kinds == {
        "apps_stdio": "stdio",
        "apps_fn_name": "function",
        "mbpp": "asserts",
        "humaneval": "asserts",
    }
    function = grade_request(RIGHT, json.dumps(TRUTHS["apps_fn_name"])).tests
    assert [(c.args, c.expected) for c in function.cases] == [([2, 3], 7), ([4, 5], 21)]
    cpp = grade_request("```cpp\nint main(){}\n```", TRUTHS["apps_stdio"])
    assert (cpp.language, cpp.code) == ("cpp", "int main(){}\n")


async def test_verls_code_reward_grades_through_the_service(service: Service) -> None:
    samples = [
        (STDIO_RIGHT, TRUTHS["apps_stdio"], 1.0),
        (EXITS, TRUTHS["apps_stdio"], 0.0),
        (RIGHT, TRUTHS["apps_fn_name"], 1.0),
        (EXITS, TRUTHS["apps_fn_name"], 0.0),
        (RIGHT, TRUTHS["mbpp"], 1.0),
        (EXITS, TRUTHS["mbpp"], 0.0),
        (RIGHT, TRUTHS["humaneval"], 1.0),
        (EXITS, TRUTHS["humaneval"], 0.0),
    ]
    scores = await asyncio.gather(
        *(
            compute_score("apps", text, truth, {}, sandbox_fusion_url=service.url)
            for text, truth, _ in samples
        )
    )
    assert list(scores) == [expected for _, _, expected in samples]
    await close_clients()
    try:
        batch = compute_score_batch(
            ["apps"] * 2, [RIGHT, EXITS], [TRUTHS["mbpp"]] * 2, sandbox_url=service.url
        )
    finally:
        close_shared_sync_clients()  # its loop's thread must not outlive the test
    assert batch == [1.0, 0.0]
