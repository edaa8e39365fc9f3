"""VLLMEngine: vLLM colocated with the trainer on its GPU, weights pushed after each update.

Written against vLLM 0.11.0 (rl/versions.py; the `vllm` extra pins it), the V1 engine, whose
engine core always runs in its own process: every argument of `collective_rpc` crosses vLLM's
msgpack encoder, which takes plain data only (no functions or classes unless insecure
serialization is switched on, which this code never asks for). Weights go by IPC in bf16 buckets
(rl.engines.vllm_cuda); sleep mode frees the GPU during the update; log-probs are the processed
(temperature-applied) ones, which equal the trainer's only with top_p = 1 (others are refused).

Placement: under torchrun, rank r's engine runs on rank r's GPU (CUDA_VISIBLE_DEVICES of the
engine's processes), where the IPC buffers are.

A sync: free the trainer's cached blocks, wake the weights, load bucket after bucket, vLLM's
post-load step, reclaim the IPC buffers, wake the KV cache, drop the stale prefix cache. A sync
that fails puts the engine back to sleep and marks it stale: it refuses to generate until a
sync succeeds (which starts from that sleep).

Used only where vllm is installed; checked on the CPU against a double of vLLM with vLLM's
process boundary and sleep semantics (tests/rl/fake_vllm.py), not yet on a GPU: docs/rl.md
says how to run scripts/gpu_check.py there.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from rl.engines.base import FinishReason, Generation, SamplingParams
from rl.engines.vllm_sync import check_allocator_config, check_logprob_match, engine_visible_devices

_ids = itertools.count()


class VLLMEngine:
    """An Engine over vllm's AsyncLLM, colocated with the trainer on one GPU.

    api: the module with SamplingParams and inputs.TokensPrompt (vllm; a test double's)."""

    def __init__(
        self,
        engine: Any,
        *,
        name: str,
        capacity_tokens: int,
        bucket_bytes: int = 512 << 20,
        api: Any = None,
    ) -> None:
        self._engine = engine
        self._bucket_bytes = bucket_bytes
        self._asleep = False
        self._stale = False
        self._name = name
        self._capacity = capacity_tokens
        self._api = api
        self.syncs = 0
        """Successful syncs (for reports and tests)."""

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
        local_rank: int = 0,
        world_size: int = 1,
        top_p: float = 1.0,
    ) -> VLLMEngine:
        """Start vLLM on model_path on this rank's GPU; capacity 0 means the engine's own
        KV-cache size."""
        from rl.versions import check_vllm

        check_vllm()
        check_logprob_match(top_p)
        check_allocator_config(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
        devices = engine_visible_devices(
            os.environ.get("CUDA_VISIBLE_DEVICES"), local_rank, world_size, tensor_parallel_size
        )
        import vllm  # type: ignore[import-not-found,unused-ignore]

        args = vllm.AsyncEngineArgs(
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
        with _environ("CUDA_VISIBLE_DEVICES", devices):  # read by the processes vLLM starts
            engine = vllm.AsyncLLMEngine.from_engine_args(args)
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

    def _vllm(self) -> Any:
        if self._api is None:
            import vllm  # type: ignore[import-not-found,unused-ignore]
            import vllm.inputs  # type: ignore[import-not-found,unused-ignore]

            self._api = vllm
        return self._api

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """One turn; vLLM batches concurrent requests itself (continuous batching)."""
        if self._stale:
            raise RuntimeError(f"{self._name}: the last weight sync failed; sync before sampling")
        check_logprob_match(params.top_p)
        api = self._vllm()
        sampling = api.SamplingParams(
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
        prompt = api.inputs.TokensPrompt(prompt_token_ids=list(prompt_ids))
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
        """Push the trainer's weights in bf16 buckets (see the module's docstring for the order);
        on failure the engine is left asleep and stale, and the error raised."""
        from rl.engines.vllm_cuda import bucketed, free_cached_memory, layout_wire, release_ipc
        from rl.engines.vllm_cuda import share as share_buffer

        try:
            params = list(named_parameters)
            device = params[0][1].device if params else torch.device("cpu")
            if self._asleep:
                free_cached_memory(device)
                await self._engine.wake_up(tags=["weights"])
            for bucket, buffer in bucketed(params, self._bucket_bytes):
                await self._engine.collective_rpc(
                    "rl_load_bucket", args=(share_buffer(buffer), layout_wire(bucket))
                )
                del buffer  # every worker has loaded it: collective_rpc returned
            await self._engine.collective_rpc("rl_finish_load")
            release_ipc(device)
            if self._asleep:
                await self._engine.wake_up(tags=["kv_cache"])
                self._asleep = False
            await self._engine.reset_prefix_cache()
        except BaseException:
            self._stale = True
            with contextlib.suppress(Exception):
                await self._engine.sleep(level=2)
                self._asleep = True
            raise
        self._stale = False
        self.syncs += 1

    async def aclose(self) -> None:
        """Shut vLLM down."""
        shutdown = getattr(self._engine, "shutdown", None)
        if shutdown is not None:
            shutdown()


@contextlib.contextmanager
def _environ(key: str, value: str) -> Iterator[None]:
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def _kv_capacity_tokens(engine: Any) -> int:
    config = getattr(engine, "vllm_config", None)
    cache = getattr(config, "cache_config", None)
    blocks = getattr(cache, "num_gpu_blocks", None)
    block_size = getattr(cache, "block_size", None)
    if not blocks or not block_size:
        raise RuntimeError("vLLM did not report its KV-cache size; set capacity_tokens")
    return int(blocks) * int(block_size)
