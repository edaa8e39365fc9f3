"""VLLMEngine: vLLM colocated with the trainer on its GPU, weights pushed after each update.

Supported: vLLM 0.10.2 to 0.11 (the `vllm` extra pins them), the V1 engine (engine core in its
own process): weights go by CUDA IPC in bf16 buckets (rl.engines.vllm_cuda), sleep mode frees
the GPU during the update, log-probs are the processed (temperature-applied) ones.

Used only where vllm is installed (`pip install vllm` on a GPU host); nothing here is imported
otherwise. It has NOT been run in this repository's CI (no GPU, no vllm there): it is written
against vLLM's documented async API (`AsyncLLMEngine.from_engine_args`, `generate(prompt,
sampling_params, request_id)` yielding `RequestOutput`s, `TokensPrompt`, `SamplingParams` with
`logprobs=0` for the sampled token's log-prob) and its worker RPC (`collective_rpc`) for the
weight sync. Check it on a GPU before relying on it; docs/rl.md says how.

KV capacity: vLLM's paged cache holds `num_gpu_blocks * block_size` tokens, known after it
profiled memory at start-up; the scheduler reserves against that.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from rl.engines.base import FinishReason, Generation, SamplingParams

_ids = itertools.count()


class VLLMEngine:
    """An Engine over vllm.AsyncLLMEngine, colocated with the trainer on one GPU."""

    def __init__(
        self, engine: Any, *, name: str, capacity_tokens: int, bucket_bytes: int = 512 << 20
    ) -> None:
        self._engine = engine
        self._bucket_bytes = bucket_bytes
        self._asleep = False
        self._name = name
        self._capacity = capacity_tokens

    @classmethod
    def create(
        cls,
        model_path: str,
        *,
        name: str = "vllm0",
        capacity_tokens: int = 0,
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
        max_model_len: int | None = None,
        tensor_parallel_size: int = 1,
        bucket_mb: int = 512,
    ) -> VLLMEngine:
        """Start vLLM on model_path; capacity 0 means the engine's own KV-cache size."""
        from vllm import (  # type: ignore[import-not-found,unused-ignore]
            AsyncEngineArgs,
            AsyncLLMEngine,
        )

        args = AsyncEngineArgs(
            model=model_path,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=True,  # the turns of a rollout share their prefix
            tensor_parallel_size=tensor_parallel_size,
            enable_sleep_mode=True,  # KV cache and weights freed during the update
            # log-probs of the distribution sampled from (temperature applied), as the trainer's
            logprobs_mode="processed_logprobs",
            worker_extension_cls="rl.engines.vllm_cuda.VLLMWorkerExtension",
        )
        engine = AsyncLLMEngine.from_engine_args(args)
        if capacity_tokens <= 0:
            capacity_tokens = _kv_capacity_tokens(engine)
        return cls(engine, name=name, capacity_tokens=capacity_tokens, bucket_bytes=bucket_mb << 20)

    @property
    def name(self) -> str:
        """This engine's name in reports."""
        return self._name

    @property
    def capacity_tokens(self) -> int:
        """Tokens of paged KV cache."""
        return self._capacity

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """One turn; vLLM batches concurrent requests itself (continuous batching)."""
        from vllm import (  # type: ignore[import-not-found,unused-ignore]
            SamplingParams as VSamplingParams,
        )
        from vllm.inputs import TokensPrompt  # type: ignore[import-not-found,unused-ignore]

        sampling = VSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(params.stop),
            stop_token_ids=list(params.stop_token_ids),
            include_stop_str_in_output=True,
            logprobs=0,  # the sampled token's log-prob only
        )
        final = None
        request_id = f"{self._name}-{next(_ids)}"
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        async for output in self._engine.generate(prompt, sampling, request_id):
            final = output
        if final is None:
            raise RuntimeError(f"vLLM returned nothing for {request_id}")
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = None
        if completion.logprobs is not None:
            logprobs = [
                float(step[token].logprob)
                for step, token in zip(completion.logprobs, token_ids, strict=True)
            ]
        reason: FinishReason = "length" if completion.finish_reason == "length" else "stop"
        stop = completion.stop_reason
        if reason == "stop" and stop is None and token_ids:
            stop = token_ids[-1]  # vLLM says None when EOS ended it; the EOS is the last token
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=reason,
            stop=stop,
            text=completion.text,
        )

    async def release_memory(self) -> None:
        """Before the update: free the KV cache and the weights (level 2: nothing kept, the
        sync overwrites every weight), so the trainer has the GPU."""
        if not self._asleep:
            await self._engine.sleep(level=2)
            self._asleep = True

    async def sync_weights(self, named_parameters: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push the trainer's weights by CUDA IPC in bf16 buckets, then drop the stale prefix
        cache: wake the weights, load bucket after bucket, wake the KV cache."""
        from rl.engines.vllm_cuda import bucketed, ipc_handle, layout_wire

        if self._asleep:
            await self._engine.wake_up(tags=["weights"])
        for bucket, buffer in bucketed(named_parameters, self._bucket_bytes):
            await self._engine.collective_rpc(
                "rl_load_bucket", args=(ipc_handle(buffer), layout_wire(bucket))
            )
            del buffer  # every worker has loaded it: collective_rpc returned
        if self._asleep:
            await self._engine.wake_up(tags=["kv_cache"])
            self._asleep = False
        await self._engine.reset_prefix_cache()

    async def aclose(self) -> None:
        """Shut vLLM down."""
        shutdown = getattr(self._engine, "shutdown", None)
        if shutdown is not None:
            shutdown()


def _kv_capacity_tokens(engine: Any) -> int:
    config = getattr(engine, "vllm_config", None)
    cache = getattr(config, "cache_config", None)
    blocks = getattr(cache, "num_gpu_blocks", None)
    block_size = getattr(cache, "block_size", None)
    if not blocks or not block_size:
        raise RuntimeError("vLLM did not report its KV-cache size; set capacity_tokens")
    return int(blocks) * int(block_size)
