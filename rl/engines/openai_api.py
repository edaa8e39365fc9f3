"""OpenAIEngine: any OpenAI-compatible completions server (vLLM, SGLang) as an Engine, for
evaluation of a policy served elsewhere.

One POST /v1/completions per turn with the prompt as token ids (both servers accept a list of
ints as `prompt`), `logprobs: 1`, the stop strings and `stop_token_ids` (a vLLM and SGLang
extension), and vLLM's `return_tokens_as_token_ids`, which names each returned token
"token_id:<id>", so token ids survive without re-tokenizing. A server that ignores it returns
token strings: then the text is re-encoded with the local tokenizer and the log-probs are kept
only if the lengths agree. Evaluation needs the text; training should use an in-process engine.

Log-probs as the Engine contract says (of the sampling distribution, temperature applied, over
the whole vocabulary) or None: servers report raw log-probs (temperature 1) unless started with
vLLM's `--logprobs-mode processed_logprobs` (then after temperature and top-p); `server_logprobs`
says which, and a reply's log-probs are kept only where they mean what the contract says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import httpx

from rl.engines.base import FinishReason, Generation, SamplingParams, find_stop


class OpenAIEngine:
    """An Engine over an OpenAI-compatible /v1/completions endpoint."""

    def __init__(
        self,
        base_url: str,
        model: str,
        encode: Callable[[str], list[int]],
        *,
        name: str = "openai0",
        capacity_tokens: int = 1 << 20,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        server_logprobs: Literal["raw", "processed"] = "raw",
    ) -> None:
        """base_url: up to and without /v1; encode: the served model's tokenizer;
        server_logprobs: what the server's log-probs are (vLLM's default is raw)."""
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )
        self._model = model
        self._encode = encode
        self._name = name
        self._capacity = capacity_tokens
        self._server_logprobs = server_logprobs

    @property
    def name(self) -> str:
        """This engine's name in reports."""
        return self._name

    @property
    def capacity_tokens(self) -> int:
        """What the scheduler may reserve here (the server's KV cache, as configured)."""
        return self._capacity

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """One turn from the server."""
        body: dict[str, Any] = {
            "model": self._model,
            "prompt": list(prompt_ids),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        reply = await self._http.post("/v1/completions", json=body)
        reply.raise_for_status()
        choice = reply.json()["choices"][0]
        text: str = choice.get("text") or ""
        # A server that drops the stop string from the text despite being asked: add it back,
        # so the rollout loop sees where the turn ended.
        stop = choice.get("stop_reason")
        if isinstance(stop, str) and stop and not text.endswith(stop):
            text += stop
        tokens, logprobs = _tokens(choice.get("logprobs"))
        if tokens is None:
            tokens = self._encode(text)
            if logprobs is not None and len(logprobs) != len(tokens):
                logprobs = None
        if logprobs is not None and len(logprobs) != len(tokens):
            logprobs = None
        if not logprobs_mean_sampling(self._server_logprobs, params):
            logprobs = None
        reason: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        if stop is None and reason == "stop":
            hit = find_stop(text, params.stop)
            stop = hit[1] if hit else None
        return Generation(tokens, logprobs, reason, stop, text)

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._http.aclose()


def logprobs_mean_sampling(server: str, params: SamplingParams) -> bool:
    """Whether a server's log-probs are those of the sampling distribution over the whole
    vocabulary: raw ones at temperature 1 (or greedy, whose contract is temperature 1),
    processed ones when top_p keeps the whole vocabulary."""
    if params.top_p < 1.0:
        return False
    return server == "processed" or params.temperature in (0.0, 1.0)


def _tokens(logprobs: Any) -> tuple[list[int] | None, list[float] | None]:
    """Token ids (when rendered as "token_id:N") and log-probs from a completions `logprobs`."""
    if not isinstance(logprobs, dict):
        return None, None
    values = logprobs.get("token_logprobs")
    floats = [float(v) if v is not None else 0.0 for v in values] if values else None
    names = logprobs.get("tokens") or []
    if names and all(isinstance(t, str) and t.startswith("token_id:") for t in names):
        return [int(t.removeprefix("token_id:")) for t in names], floats
    return None, floats
