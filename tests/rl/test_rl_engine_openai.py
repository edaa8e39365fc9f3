"""The OpenAI-compatible engine's request and its reading of vLLM- and SGLang-style replies.

The server is an httpx MockTransport answering in the completions format: the seam is the HTTP
transport, the engine's code runs unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from rl.engines.base import SamplingParams
from rl.engines.openai_api import OpenAIEngine


def server(reply: dict[str, Any], seen: list[dict[str, Any]]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/completions"
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [reply]})

    return httpx.MockTransport(handle)


PARAMS = SamplingParams(
    max_new_tokens=32, temperature=0.6, stop=("</tool_call>", "<|im_end|>"), stop_token_ids=(7,)
)


async def test_token_ids_and_logprobs_from_a_vllm_reply() -> None:
    seen: list[dict[str, Any]] = []
    reply = {
        "text": "x = 1</tool_call>",
        "finish_reason": "stop",
        "stop_reason": "</tool_call>",
        "logprobs": {"tokens": ["token_id:5", "token_id:9"], "token_logprobs": [-0.5, -0.25]},
    }
    engine = OpenAIEngine(
        "http://server",
        "policy",
        lambda s: [0],
        transport=server(reply, seen),
        api_key="k",
        server_logprobs="processed",
    )
    try:
        generation = await engine.generate([1, 2, 3], PARAMS)
    finally:
        await engine.aclose()
    (body,) = seen
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 32
    assert body["stop"] == ["</tool_call>", "<|im_end|>"] and body["stop_token_ids"] == [7]
    assert body["temperature"] == 0.6 and body["logprobs"] == 1
    assert generation.token_ids == [5, 9] and generation.logprobs == [-0.5, -0.25]
    assert (generation.finish_reason, generation.stop) == ("stop", "</tool_call>")


async def test_a_server_without_token_ids_is_re_encoded_locally() -> None:
    seen: list[dict[str, Any]] = []
    reply = {
        "text": "abc",
        "finish_reason": "length",
        "logprobs": {"tokens": ["a", "bc"], "token_logprobs": [-1.0, -2.0]},
    }
    engine = OpenAIEngine(
        "http://server", "policy", lambda s: [ord(c) for c in s], transport=server(reply, seen)
    )
    try:
        generation = await engine.generate([1], PARAMS)
    finally:
        await engine.aclose()
    # Three local tokens for two server tokens: the server's log-probs cannot be aligned.
    assert generation.token_ids == [97, 98, 99] and generation.logprobs is None
    assert generation.finish_reason == "length"


async def test_a_stop_string_left_out_by_the_server_is_put_back() -> None:
    reply = {"text": "call", "finish_reason": "stop", "stop_reason": "</tool_call>"}
    engine = OpenAIEngine(
        "http://server", "policy", lambda s: [len(s)], transport=server(reply, [])
    )
    try:
        generation = await engine.generate([1], PARAMS)
    finally:
        await engine.aclose()
    assert generation.text == "call</tool_call>"


async def test_raw_logprobs_are_kept_only_where_they_are_the_sampling_distributions() -> None:
    reply = {
        "text": "ab",
        "finish_reason": "length",
        "logprobs": {"tokens": ["token_id:5", "token_id:9"], "token_logprobs": [-0.5, -0.25]},
    }
    got = {}
    for server_kind, temperature, top_p in (
        ("raw", 0.6, 1.0),
        ("raw", 1.0, 1.0),
        ("processed", 0.6, 1.0),
        ("processed", 1.0, 0.9),
    ):
        engine = OpenAIEngine(
            "http://server",
            "policy",
            lambda s: [0],
            transport=server(reply, []),
            server_logprobs=server_kind,  # type: ignore[arg-type]
        )
        params = SamplingParams(max_new_tokens=8, temperature=temperature, top_p=top_p)
        try:
            got[(server_kind, temperature, top_p)] = (await engine.generate([1], params)).logprobs
        finally:
            await engine.aclose()
    assert got == {
        ("raw", 0.6, 1.0): None,  # temperature 1 log-probs: not the distribution sampled from
        ("raw", 1.0, 1.0): [-0.5, -0.25],
        ("processed", 0.6, 1.0): [-0.5, -0.25],
        ("processed", 1.0, 0.9): None,  # renormalised over the nucleus: not the trainer's
    }
