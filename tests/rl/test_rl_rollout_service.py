"""The rollout loop against a real rl-sandbox (`rl-sandbox up`: Redis, workers, nsjail, API)
with a tiny transformers model that has memorised two tool-using answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import torch
from rl_tiny import DIVISION, PRODUCT, TEMPLATE, memorise, tiny_policy

from rl.data.tasks import tool_call_text
from rl.engines.base import Engine, Generation, SamplingParams
from rl.engines.hf import TransformersEngine
from rl.logprobs import pad_responses, response_logprobs
from rl.reward.answer import extract_answer
from rl.rollout.loop import HFCodec, RolloutSettings, run_rollout
from rl.rollout.scheduler import RolloutJob, RolloutScheduler
from rl.run.local_service import LocalService
from rl.trajectory import Trajectory
from trainer_client import SandboxClient
from trainer_client.wire import ExecuteResult

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def policy() -> tuple[Any, Any, HFCodec]:
    tokenizer, model, codec = tiny_policy()
    loss = memorise(model, codec, tokenizer.pad_token_id)
    assert loss < 0.05, f"the tiny model did not memorise its demonstrations (loss {loss})"
    return tokenizer, model, codec


@pytest.fixture
async def client(sandbox: LocalService) -> AsyncIterator[SandboxClient]:
    async with SandboxClient(sandbox.url) as c:
        yield c


def settings(tokenizer: Any, **overrides: Any) -> RolloutSettings:
    values: dict[str, Any] = {
        "max_turns": 4,
        "max_response_tokens": 400,
        "temperature": 0.0,
        "stop_token_ids": (tokenizer.eos_token_id,),
    }
    return RolloutSettings(**(values | overrides))


async def roll(
    policy: tuple[Any, Any, HFCodec], client: Any, question: str, **overrides: Any
) -> Trajectory:
    tokenizer, model, codec = policy
    engine = TransformersEngine(model, tokenizer, capacity_tokens=4096)
    try:
        prompt = codec.encode(TEMPLATE.prompt(question))
        return await run_rollout(
            engine, client, codec, TEMPLATE, prompt, settings(tokenizer, **overrides)
        )
    finally:
        await engine.aclose()


async def test_tool_call_runs_in_the_sandbox_and_its_response_is_masked(
    policy: tuple[Any, Any, HFCodec], client: SandboxClient
) -> None:
    _, model, codec = policy
    t = await roll(policy, client, PRODUCT.question)
    t.check()
    assert t.finish_reason == "answer" and not t.truncated
    assert t.num_turns == 2
    (call,) = t.tool_results
    assert isinstance(call.result, ExecuteResult)
    assert (call.status, call.result.stdout, call.code) == ("ok", "56088\n", "print(123 * 456)")
    assert call.text.startswith("Tool call success\nstdout: 56088\n")
    # Sampled turns are mask 1, and are the model's turns; the rest is the template's glue.
    (a, b), (c, d) = t.turn_spans
    assert a == 0 and d == len(t.response_ids)
    assert t.loss_mask == [1] * b + [0] * (c - b) + [1] * (d - c)
    assert codec.decode(t.response_ids[:b]) == PRODUCT.turns[0]
    assert codec.decode(t.response_ids[b:c]) == TEMPLATE.tool_turn([call.text], close_turn=True)
    assert codec.decode(t.response_ids[c:]) == PRODUCT.turns[1] + "<|im_end|>"
    assert extract_answer(t.generated_text) == "56088"
    # Log-probs: 0 where masked; where sampled, what the trainer's forward computes.
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m == 0)
    batch = pad_responses([t.prompt_ids], [t.response_ids], [t.loss_mask], pad_id=0)
    with torch.no_grad():
        recomputed = response_logprobs(model, batch)[0]
    sampled = torch.tensor(t.logprobs)
    mask = torch.tensor(t.loss_mask, dtype=torch.bool)
    assert torch.allclose(recomputed[mask], sampled[mask], atol=1e-4)


async def test_a_failing_program_is_a_result_not_an_exception(
    policy: tuple[Any, Any, HFCodec], client: SandboxClient
) -> None:
    t = await roll(policy, client, DIVISION.question)
    (call,) = t.tool_results
    assert call.status == "error"
    assert call.text.startswith("Tool call failure\n")
    assert "ZeroDivisionError" in call.text
    assert t.num_turns == 2  # the model was shown the failure and went on


async def test_turn_limit_stops_before_running_the_last_turns_call(
    policy: tuple[Any, Any, HFCodec], client: SandboxClient
) -> None:
    _, _, codec = policy
    t = await roll(policy, client, PRODUCT.question, max_turns=1)
    assert (t.finish_reason, t.num_turns, t.tool_results) == ("max_turns", 1, [])
    assert codec.decode(t.response_ids).endswith("</tool_call>")
    assert set(t.loss_mask) == {1}


async def test_token_budget_cuts_a_turn_and_is_truncation(
    policy: tuple[Any, Any, HFCodec], client: SandboxClient
) -> None:
    t = await roll(policy, client, PRODUCT.question, max_response_tokens=8)
    assert (t.finish_reason, t.truncated, len(t.response_ids)) == ("max_tokens", True, 8)


async def test_a_tool_response_that_does_not_fit_is_not_appended(
    policy: tuple[Any, Any, HFCodec], client: SandboxClient
) -> None:
    full = await roll(policy, client, PRODUCT.question)
    first_turn = full.turn_spans[0][1]
    t = await roll(policy, client, PRODUCT.question, max_response_tokens=first_turn + 3)
    assert t.finish_reason == "max_tokens" and t.truncated
    assert t.response_ids == full.response_ids[:first_turn]  # ends on the model's own turn
    assert t.tool_results == []


class ScriptedEngine:
    """Plays each question's demonstration turns in order; a first turn may wait for an event."""

    def __init__(self, codec: HFCodec, gates: dict[str, asyncio.Event]) -> None:
        self.codec, self.gates = codec, gates
        self.name, self.capacity_tokens = "scripted", 1 << 20

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        text = self.codec.decode(prompt_ids)
        demo = next(d for d in (PRODUCT, DIVISION) if TEMPLATE.prompt(d.question) in text)
        turn = text.count("<tool_response>")
        if turn == 0 and demo.question in self.gates:
            await asyncio.wait_for(self.gates.pop(demo.question).wait(), timeout=30)
        last = turn == len(demo.turns) - 1
        ids = self.codec.encode(demo.turns[turn] + ("<|im_end|>" if last else ""))
        return Generation(ids, [-0.1] * len(ids), "stop", "<|im_end|>" if last else "</tool_call>")


class Recording:
    """A tools object that opens a gate when it sends a call."""

    def __init__(self, inner: SandboxClient, gate: asyncio.Event) -> None:
        self.inner, self.gate = inner, gate
        self.sent: list[str] = []

    async def execute(
        self,
        code: str,
        *,
        stdin: str = "",
        timeout: float = 10.0,  # noqa: ASYNC109 -- the program's limit (client API)
    ) -> ExecuteResult:
        self.sent.append(code)
        self.gate.set()
        return await self.inner.execute(code, stdin=stdin, timeout=timeout)


async def test_a_tool_call_is_sent_while_other_rollouts_are_still_generating(
    policy: tuple[Any, Any, HFCodec], client: SandboxClient
) -> None:
    tokenizer, _, codec = policy
    # The slow rollout's first turn cannot finish until the fast rollout's call has been sent:
    # with a barrier (all first turns, then all calls) this would time out.
    gate = asyncio.Event()
    engine = ScriptedEngine(codec, {DIVISION.question: gate})
    tools = Recording(client, gate)
    s = settings(tokenizer, max_turns=2)
    fast, slow = await asyncio.gather(
        *(
            run_rollout(engine, tools, codec, TEMPLATE, codec.encode(TEMPLATE.prompt(q)), s)
            for q in (PRODUCT.question, DIVISION.question)
        )
    )
    assert tools.sent == ["print(123 * 456)", "print(7 / 0)"]
    assert [r.status for r in fast.tool_results + slow.tool_results] == ["ok", "error"]
    assert fast.finish_reason == slow.finish_reason == "answer"


async def test_scheduler_over_two_engines_of_different_capacity(
    policy: tuple[Any, Any, HFCodec], client: SandboxClient
) -> None:
    tokenizer, model, codec = policy
    s = settings(tokenizer, temperature=1.0)
    prompts = [codec.encode(TEMPLATE.prompt(d.question)) for d in (PRODUCT, DIVISION)]
    reserve = max(len(p) for p in prompts) + s.max_response_tokens
    big = TransformersEngine(model, tokenizer, name="big", capacity_tokens=4 * reserve)
    small = TransformersEngine(model, tokenizer, name="small", capacity_tokens=reserve)
    jobs = [RolloutJob(prompts[i % 2], reserve, group=i % 2) for i in range(12)]

    async def one(engine: Engine, job: RolloutJob) -> Trajectory:
        return await run_rollout(
            engine, client, codec, TEMPLATE, job.prompt_ids, s, group=job.group
        )

    scheduler: RolloutScheduler[Trajectory] = RolloutScheduler([big, small])
    try:
        done = await scheduler.run(jobs, one)
    finally:
        await big.aclose()
        await small.aclose()
    assert len(done) == 12 and [t.group for t in done] == [i % 2 for i in range(12)]
    report = scheduler.last_report.as_dict()
    assert report["big"]["peak_concurrent"] <= 4 and report["small"]["peak_concurrent"] <= 1
    assert report["big"]["rollouts"] + report["small"]["rollouts"] == 12
    for t in done:
        t.check()
        assert len(t.response_ids) <= s.max_response_tokens
        assert t.num_turns <= s.max_turns
    assert big.peak_tokens_in_use <= big.capacity_tokens
    assert any(t.tool_results for t in done)


class TurnsEngine:
    """Plays the given (text, stop) turns in order, as an engine would have sampled them."""

    def __init__(self, codec: HFCodec, turns: Sequence[tuple[str, str | int | None]]) -> None:
        self.codec, self.turns = codec, list(turns)
        self.name, self.capacity_tokens = "turns", 1 << 20

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        text, stop = self.turns.pop(0)
        ids = self.codec.encode(text)
        return Generation(ids, [-0.1] * len(ids), "stop", stop)


async def play(
    policy: tuple[Any, Any, HFCodec], tools: Any, turns: Sequence[tuple[str, str | int | None]]
) -> Trajectory:
    tokenizer, _, codec = policy
    engine = TurnsEngine(codec, turns)
    prompt = codec.encode(TEMPLATE.prompt(PRODUCT.question))
    t = await run_rollout(engine, tools, codec, TEMPLATE, prompt, settings(tokenizer))
    assert not engine.turns, "the rollout stopped before its last turn"
    return t


async def test_a_turn_with_an_answer_and_a_tool_call_still_runs_the_call(
    policy: tuple[Any, Any, HFCodec], client: SandboxClient
) -> None:
    # The release stops only on a turn without a tool call; an early <answer> does not end it.
    first = "<answer>\\boxed{1}</answer>\n" + tool_call_text("print(123 * 456)")
    last = "<answer>\\boxed{56088}</answer><|im_end|>"
    t = await play(policy, client, [(first, "</tool_call>"), (last, "<|im_end|>")])
    t.check()
    assert (t.finish_reason, t.num_turns) == ("answer", 2)
    assert [(r.status, r.result.stdout if r.result else None) for r in t.tool_results] == [
        ("ok", "56088\n")
    ]
    assert extract_answer(t.generated_text) == "56088"


async def test_an_end_of_turn_that_is_the_eos_is_not_written_twice(
    policy: tuple[Any, Any, HFCodec], client: SandboxClient
) -> None:
    # vLLM reports stop_reason None when the EOS (here <|im_end|>) ended the turn, and keeps it
    # in the tokens: the tool turn must not close the model's turn a second time.
    _, _, codec = policy
    unterminated = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}<|im_end|>'
    last = "<answer>\\boxed{1}</answer><|im_end|>"
    t = await play(policy, client, [(unterminated, None), (last, "<|im_end|>")])
    (record,) = t.tool_results
    assert record.status == "parse_error"
    (_, b), (c, _) = t.turn_spans
    assert codec.decode(t.response_ids[b:c]) == TEMPLATE.tool_turn([record.text], close_turn=False)
    assert "<|im_end|>\n<|im_end|>" not in t.response_text
