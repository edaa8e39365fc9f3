"""Code rewards' pure parts: the final code block, the grade request, and how CodeGrader turns the
service's results into rewards (a stand-in client answering as POST /grade/batch does)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from rl.config import GRPOConfig
from rl.reward.answer import extract_code
from rl.reward.grading import CodeGrader, ServiceGrader, UnjudgedAnswerError, grade_request
from rl.run.context import RunContext
from trainer_client.grade_wire import GradeRequest, GradeResult

TESTS = json.dumps(
    {"kind": "function", "entry_point": "add", "cases": [{"args": [1, 2], "expected": 3}]}
)
STDIO = json.dumps({"kind": "stdio", "cases": [{"stdin": "2\n", "expected_stdout": "4\n"}]})


def answered(code: str, tag: str = "python") -> str:
    return f"Done.</reason>\n<answer>\n```{tag}\n{code}\n```\n</answer>"


def test_the_last_block_of_the_last_answer_is_the_code() -> None:
    response = (
        "```python\nscratch()\n```<answer>```python\nfirst()\n```</answer>"
        "<answer>\n```py\nfinal()\n```\n```c++\nint main(){}\n```</answer>"
    )
    assert extract_code(response) == ("cpp", "int main(){}\n")
    assert extract_code(answered("x = 1")) == ("python", "x = 1\n")


def test_no_block_in_an_answer_is_no_code_unless_the_fallback_allows() -> None:
    response = "```python\nprint(4)\n```\n<answer>4</answer>"
    assert extract_code(response) is None
    assert extract_code(response, fallback_to_last_block=True) == ("python", "print(4)\n")
    assert extract_code("no code at all", fallback_to_last_block=True) is None


def test_the_request_calls_python_for_function_tests_and_keeps_cpp_for_stdio() -> None:
    request = grade_request(
        answered("def add(a, b): ...", "cpp"), TESTS, fallback_to_last_block=False
    )
    assert request is not None and request.language == "python"
    assert request.tests.kind == "function"
    request = grade_request(answered("int main(){}", "cpp"), STDIO, fallback_to_last_block=False)
    assert request is not None and request.language == "cpp"


@pytest.mark.parametrize("truth", ["", "4", '{"kind": "stdio", "cases": []}', '{"inputs": [1]}'])
def test_a_truth_that_is_no_tests_object_is_refused(truth: str) -> None:
    with pytest.raises(ValueError, match="not a `tests` object"):
        grade_request(answered("x = 1"), truth, fallback_to_last_block=False)


class Answering:
    """Answers each grade request with the next of `rewards` (None: queue_timeout)."""

    def __init__(self, rewards: Sequence[float | None]) -> None:
        self.rewards = list(rewards)
        self.sent: list[list[str]] = []

    async def grade(self, requests: Sequence[GradeRequest | dict[str, Any]]) -> list[GradeResult]:
        self.sent.append([r.code for r in requests if isinstance(r, GradeRequest)])
        out = []
        for i, _ in enumerate(requests):
            reward = self.rewards.pop(0)
            status = "graded" if reward is not None else "queue_timeout"
            out.append(GradeResult(id=str(i), status=status, reward=reward))
        return out


async def test_rewards_are_the_services_and_no_code_is_zero_without_a_request() -> None:
    client = Answering([1.0, 0.5])
    responses = [answered("a"), "no code", answered("b")]
    rewards = await CodeGrader(client).rewards(responses, [TESTS] * 3)
    assert rewards == [1.0, 0.0, 0.5]
    assert client.sent == [["a\n", "b\n"]]  # one request for the rollouts that end together


async def test_an_ungraded_candidate_raises_never_zero() -> None:
    grader = CodeGrader(Answering([None]))
    with pytest.raises(UnjudgedAnswerError, match="queue_timeout"):
        await grader.reward(answered("a"), TESTS)


async def test_rollouts_ending_apart_go_in_separate_requests() -> None:
    client = Answering([1.0, 0.0])
    grader = CodeGrader(client, max_wait_s=0.01)

    async def later() -> float:
        await asyncio.sleep(0.2)
        return await grader.reward(answered("b"), TESTS)

    assert await asyncio.gather(grader.reward(answered("a"), TESTS), later()) == [1.0, 0.0]
    assert client.sent == [["a\n"], ["b\n"]]


def test_the_answer_kind_is_checked_and_math_by_default() -> None:
    assert GRPOConfig().answer_kind == "math"
    with pytest.raises(ValueError, match="answer_kind"):
        GRPOConfig(answer_kind="tests")  # type: ignore[arg-type]


def test_the_run_picks_the_code_grader_by_the_answer_kind() -> None:
    run = SimpleNamespace(verify_client=Answering([]), verifier=None)
    code = RunContext.grader(run, GRPOConfig(answer_kind="code"))  # type: ignore[arg-type]
    assert isinstance(code, CodeGrader) and code.client is run.verify_client
    assert isinstance(RunContext.grader(run, GRPOConfig()), ServiceGrader)  # type: ignore[arg-type]
    offline = SimpleNamespace(verify_client=None, verifier=object())
    with pytest.raises(ValueError, match="graded by the service"):
        RunContext.grader(offline, GRPOConfig(answer_kind="code"))  # type: ignore[arg-type]
