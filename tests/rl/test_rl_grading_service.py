"""Grading through the service's POST /verify against the trainer's own pool, and per rollout
while the other rollouts still run (a real `rl-sandbox up`: Redis, workers, nsjail, API)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

import pytest
from rl_tiny import TEMPLATE, tiny_policy

from rl.data.tasks import Problem
from rl.engines.base import Generation, SamplingParams
from rl.reward.grading import CodeGrader, LocalGrader, ServiceGrader
from rl.reward.verifier import VerifierPool
from rl.rollout.loop import HFCodec, RolloutSettings
from rl.rollout.scheduler import RolloutScheduler
from rl.run.collect import collect_graded
from rl.run.local_service import LocalService
from rl.trajectory import Trajectory
from trainer_client import SandboxClient, VerifyItem, VerifyResult

pytestmark = pytest.mark.slow


def answered(latex: str) -> str:
    return f"I computed it.</reason>\n<answer>\nThe answer is $\\boxed{{{latex}}}$.\n</answer>"


CASES = [
    (answered("1/2"), "0.5"),  # equivalent, written differently
    (answered("\\frac{1}{2}"), "0.5"),
    (answered("2^{10}"), "1024"),
    (answered("(x+1)^2"), "x^2 + 2x + 1"),
    (answered("3"), "4"),  # wrong
    ("No boxed answer at all.", "4"),
    (answered("0.5000001"), "0.5"),  # within rel_tol = 1e-6 (2e-7 relative)
    (answered("17"), "17.5"),
]


@pytest.fixture
async def client(sandbox: LocalService) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(sandbox.url) as c:
        yield c


async def test_the_service_gives_the_local_pools_rewards(
    client: SandboxClient, verifier: VerifierPool
) -> None:
    responses, truths = [r for r, _ in CASES], [t for _, t in CASES]
    local = await LocalGrader(verifier).rewards(responses, truths)
    service = await ServiceGrader(client).rewards(responses, truths)
    assert service == local
    assert local == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]


class Recording:
    """The real client's verify, noting the answers sent and opening a gate on the first."""

    def __init__(self, client: SandboxClient, gate: asyncio.Event) -> None:
        self.client, self.gate = client, gate
        self.sent: list[list[str]] = []

    async def verify(
        self,
        items: Sequence[VerifyItem | tuple[str, str]],
        *,
        timeout: float = 5.0,  # noqa: ASYNC109 (the check limit, named as the API field)
        rel_tol: float = 1e-6,
    ) -> list[VerifyResult]:
        self.sent.append([i.answer if isinstance(i, VerifyItem) else i[0] for i in items])
        self.gate.set()
        return await self.client.verify(items, timeout=timeout, rel_tol=rel_tol)


class GatedEngine:
    """Answers at once, except the question "slow", which waits for the gate first."""

    def __init__(self, codec: HFCodec, gate: asyncio.Event) -> None:
        self.codec, self.gate = codec, gate
        self.name, self.capacity_tokens = "gated", 1 << 20

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        prompt = self.codec.decode(list(prompt_ids))
        if "slow" in prompt:
            await self.gate.wait()
            text = answered("7") + "<|im_end|>"
        else:
            text = answered("\\frac{2}{4}") + "<|im_end|>"
        ids = self.codec.encode(text)
        return Generation(ids, [-0.1] * len(ids), "stop", "<|im_end|>")


async def test_each_rollout_is_graded_while_the_others_still_run(client: SandboxClient) -> None:
    tokenizer, _, codec = tiny_policy()
    gate = asyncio.Event()
    recording = Recording(client, gate)
    # The slow rollout cannot finish until the fast one has been sent for grading: grading
    # only after every rollout would wait forever (wait_for makes that a failure).
    scheduler: RolloutScheduler[Trajectory] = RolloutScheduler([GatedEngine(codec, gate)])
    settings = RolloutSettings(
        max_turns=2, max_response_tokens=200, stop_token_ids=(tokenizer.eos_token_id,)
    )
    problems = [Problem("fast", "0.5"), Problem("slow", "8")]
    trajectories, correct = await asyncio.wait_for(
        collect_graded(
            scheduler, client, codec, TEMPLATE, problems, 1, settings, ServiceGrader(recording)
        ),
        timeout=120,
    )
    assert [t.group for t in trajectories] == [0, 1]
    assert correct == [1.0, 0.0]
    assert recording.sent == [["\\frac{2}{4}"], ["7"]]


ADD_TESTS = json.dumps(
    {
        "kind": "function",
        "entry_point": "add",
        "cases": [{"args": [1, 2], "expected": 3}, {"args": [-5, 5], "expected": 0}],
    }
)


def coded(code: str) -> str:
    return f"Here it is.</reason>\n<answer>\n```python\n{code}\n```\n</answer>"


async def test_code_rewards_are_the_sealed_grades(client: SandboxClient) -> None:
    responses = [
        coded("def add(a, b):\n    return a + b"),
        coded("def add(a, b):\n    return a - b"),
        coded("import sys\nsys.exit(0)\ndef add(a, b):\n    return 0"),
        "def add(a, b): return a + b  (no code block)",
    ]
    rewards = await CodeGrader(client).rewards(responses, [ADD_TESTS] * len(responses))
    assert rewards == [1.0, 0.0, 0.0, 0.0]
