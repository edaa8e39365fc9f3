"""The transformers engine: continuous batching gives what one request alone would get."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from rl_tiny import TEMPLATE, tiny_policy

from rl.engines.base import SamplingParams
from rl.engines.hf import TransformersEngine, sample_tokens
from rl.logprobs import pad_responses, response_logprobs


@pytest.fixture(scope="module")
def policy() -> tuple[Any, Any, Any]:
    return tiny_policy(seed=3)


def prompts(codec: Any) -> list[list[int]]:
    questions = ["What is 1 * 2?", "Q", "A much longer question, to pad the others: what is 9 * 9?"]
    return [codec.encode(TEMPLATE.prompt(q)) for q in questions]


async def test_batched_greedy_turns_equal_the_same_requests_alone(
    policy: tuple[Any, Any, Any],
) -> None:
    tokenizer, model, codec = policy
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    engine = TransformersEngine(model, tokenizer, capacity_tokens=4096)
    try:
        alone = [await engine.generate(p, params) for p in prompts(codec)]
        together = await asyncio.gather(*(engine.generate(p, params) for p in prompts(codec)))
    finally:
        await engine.aclose()
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    for a, b in zip(alone, together, strict=True):
        assert a.logprobs is not None and b.logprobs is not None
        assert a.finish_reason == "length" and len(a.token_ids) == 12
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


async def test_sampled_logprobs_are_what_the_trainer_recomputes(
    policy: tuple[Any, Any, Any],
) -> None:
    tokenizer, model, codec = policy
    engine = TransformersEngine(model, tokenizer, capacity_tokens=4096, seed=1)
    params = SamplingParams(max_new_tokens=10, temperature=0.7)
    try:
        generations = await asyncio.gather(*(engine.generate(p, params) for p in prompts(codec)))
    finally:
        await engine.aclose()
    batch = pad_responses(
        prompts(codec),
        [g.token_ids for g in generations],
        [[1] * len(g.token_ids) for g in generations],
        pad_id=tokenizer.pad_token_id,
    )
    with torch.no_grad():
        recomputed = response_logprobs(model, batch, temperature=0.7)
    for i, g in enumerate(generations):
        assert g.logprobs is not None
        expected = torch.tensor(g.logprobs)
        assert torch.allclose(recomputed[i, : len(g.logprobs)], expected, atol=1e-4)


async def test_stop_token_and_stop_string_end_a_turn(policy: tuple[Any, Any, Any]) -> None:
    tokenizer, model, codec = policy
    prompt = prompts(codec)[0]
    engine = TransformersEngine(model, tokenizer, capacity_tokens=4096)
    try:
        free = await engine.generate(prompt, SamplingParams(max_new_tokens=6, temperature=0.0))
        token = free.token_ids[2]
        by_id = await engine.generate(
            prompt, SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(token,))
        )
        text = codec.decode(free.token_ids[:3])
        by_text = await engine.generate(
            prompt, SamplingParams(max_new_tokens=6, temperature=0.0, stop=(text[-2:],))
        )
    finally:
        await engine.aclose()
    assert by_id.token_ids == free.token_ids[: free.token_ids.index(token) + 1]
    assert (by_id.finish_reason, by_id.stop) == ("stop", token)
    assert codec.decode(by_text.token_ids).endswith(text[-2:])
    assert by_text.finish_reason == "stop" and len(by_text.token_ids) <= 3


def test_sample_tokens_greedy_and_nucleus() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    generator = torch.Generator().manual_seed(0)
    greedy, logp = sample_tokens(logits, torch.zeros(2), torch.ones(2), generator)
    assert greedy.tolist() == [1, 0]
    assert torch.allclose(logp, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])
    # A tiny nucleus keeps only the most likely token, whatever the draw.
    for _ in range(20):
        tokens, _ = sample_tokens(logits, torch.ones(2), torch.full((2,), 1e-6), generator)
        assert tokens.tolist() == [1, 0]
