"""VLLMEngine: vLLM colocated with the trainer on its GPU, weights pushed after each update.

Written against vLLM 0.11.0 (rl/versions.py; the `vllm` extra pins it), the V1 engine, whose
engine core always runs in its own process: every argument of `collective_rpc` crosses vLLM's
msgpack encoder, which takes plain data only (no functions or classes unless insecure
serialization is switched on, which this code never asks for). Weights go by IPC in buckets of
the engine's dtype (rl.engines.vllm_cuda); sleep mode frees the GPU during the update; log-probs
are the processed (temperature-applied) ones, which equal the trainer's only with top_p = 1
(others are refused).

Placement: under torchrun, rank r's engine runs on rank r's GPU (CUDA_VISIBLE_DEVICES, and
HIP_VISIBLE_DEVICES where set, of the engine's processes), where the IPC buffers are, with its
own compile cache (rl.engines.vllm_sync.engine_environment). Colocation needs vLLM's sleep mode:
where the platform of the installed vLLM has none (vLLM 0.11.0 on ROCm), a colocated engine is
refused at start with what to do instead. The separate placement (one trainer process) starts
the engine on GPUs of its own without sleep mode, and broadcasts each bucket to its workers
through a weight-update group (rl.engines.vllm_cuda.WeightGroup) instead of IPC.

A sync: free the trainer's cached blocks, wake the weights, load bucket after bucket, vLLM's
post-load step, reclaim the IPC buffers, wake the KV cache, drop the stale prefix cache. A sync
that fails puts the engine back to sleep (waking first what still sleeps: vLLM ignores a sleep
while any tag sleeps) and marks it stale: it refuses to generate until a
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
from typing import TYPE_CHECKING, Any

import torch

from rl.engines.base import FinishReason, Generation, SamplingParams
from rl.engines.vllm_sync import (
    Placement,
    check_allocator_config,
    check_logprob_match,
    check_placement,
    engine_environment,
    separate_environment,
)

if TYPE_CHECKING:
    from rl.engines.vllm_cuda import WeightGroup

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
        dtype: torch.dtype = torch.bfloat16,
        placement: Placement = "colocated",
        tensor_parallel_size: int = 1,
        api: Any = None,
    ) -> None:
        self._engine = engine
        self._separate = placement == "separate"  # weights broadcast, no sleep mode
        self._group: WeightGroup | None = None  # joined at the separate placement's first sync
        self._workers = tensor_parallel_size
        self._bucket_bytes = bucket_bytes
        self._dtype = dtype
        self._sleeping: set[str] = set()  # vLLM's sleeping tags, as this engine left them
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
        rank: int = 0,
        top_p: float = 1.0,
        placement: Placement = "colocated",
        engine_devices: str = "",
    ) -> VLLMEngine:
        """Start vLLM on model_path: colocated, on this rank's GPU; separate, on engine_devices
        (GPUs of its own, weights broadcast from the trainer's). Capacity 0 means the engine's
        own KV-cache size."""
        from rl.versions import check_vllm

        check_vllm()
        check_logprob_match(top_p)
        import vllm  # type: ignore[import-not-found,unused-ignore]

        check_placement(
            placement,
            vllm_version=vllm.__version__,
            sleep_mode=_platform_has_sleep_mode(),
            world_size=world_size,
            engine_devices=engine_devices,
            tensor_parallel_size=tensor_parallel_size,
        )
        if placement == "colocated":
            check_allocator_config(os.environ)
            environment = engine_environment(
                os.environ,
                local_rank=local_rank,
                world_size=world_size,
                rank=rank,
                tensor_parallel_size=tensor_parallel_size,
            )
        else:
            environment = separate_environment(os.environ, engine_devices)

        args = vllm.AsyncEngineArgs(
            model=model_path,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            max_model_len=max_model_len,
            enable_prefix_caching=True,  # the turns of a rollout share their prefix
            tensor_parallel_size=tensor_parallel_size,
            enable_sleep_mode=placement == "colocated",  # frees the GPU during the update
            # log-probs of the distribution sampled from (temperature applied), as the trainer's
            logprobs_mode="processed_logprobs",
            worker_extension_cls="rl.engines.vllm_cuda.VLLMWorkerExtension",
        )
        with _environ(environment):  # read by the processes vLLM starts
            engine = vllm.AsyncLLMEngine.from_engine_args(args)
        if capacity_tokens <= 0:
            capacity_tokens = _kv_capacity_tokens(engine)
        return cls(
            engine,
            name=name,
            capacity_tokens=capacity_tokens,
            bucket_bytes=bucket_mb << 20,
            dtype=_model_dtype(engine),
            placement=placement,
            tensor_parallel_size=tensor_parallel_size,
        )

    async def _join_weight_group(self, device: torch.device) -> WeightGroup:
        """The separate placement's weight group: the trainer joins as rank 0 while each worker
        joins through collective_rpc (on one host: the engine's GPUs are this node's)."""
        import asyncio

        from rl.engines.vllm_cuda import WeightGroup

        host, port, size = "127.0.0.1", _free_port(), 1 + self._workers
        workers = self._engine.collective_rpc("rl_init_weight_group", args=(host, port, size))
        mine = asyncio.to_thread(WeightGroup, host, port, 0, size, device)
        _, group = await asyncio.gather(workers, mine)
        return group

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
        sync overwrites every weight), so the trainer has the GPU. The separate placement's
        engine is on GPUs of its own: nothing to free."""
        if not self._separate and not self._sleeping:
            await self._sleep()

    async def _sleep(self) -> None:
        # vLLM ignores a sleep while any tag still sleeps: wake those first, so that the
        # weights are freed too (a sync that failed after waking them left the KV cache asleep)
        if self._sleeping:
            await self._engine.wake_up(tags=sorted(self._sleeping))
            self._sleeping.clear()
        await self._engine.sleep(level=2)
        self._sleeping = {"weights", "kv_cache"}

    async def _wake(self, tag: str) -> None:
        if tag in self._sleeping:
            await self._engine.wake_up(tags=[tag])
            self._sleeping.discard(tag)

    async def sync_weights(self, named_parameters: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push the trainer's weights in buckets of the engine's dtype (see the module's
        docstring for the order); on failure the engine is left asleep and stale, and the error
        raised."""
        from rl.engines.vllm_cuda import bucketed, free_cached_memory, layout_wire, release_ipc
        from rl.engines.vllm_cuda import share as share_buffer

        if self._separate:
            await self._broadcast_weights(named_parameters)
            return
        try:
            params = list(named_parameters)
            device = params[0][1].device if params else torch.device("cpu")
            if "weights" in self._sleeping:
                free_cached_memory(device)
                await self._wake("weights")
            for bucket, buffer in bucketed(params, self._bucket_bytes, dtype=self._dtype):
                await self._engine.collective_rpc(
                    "rl_load_bucket", args=(share_buffer(buffer), layout_wire(bucket))
                )
                del buffer  # every worker has loaded it: collective_rpc returned
            await self._engine.collective_rpc("rl_finish_load")
            release_ipc(device)
            await self._wake("kv_cache")
            await self._engine.reset_prefix_cache()
        except BaseException:
            self._stale = True
            with contextlib.suppress(Exception):
                await self._sleep()
            raise
        self._stale = False
        self.syncs += 1

    async def _broadcast_weights(
        self, named_parameters: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """The separate placement's sync: each bucket broadcast from the trainer to the
        workers, which load it (vLLM's weight-update path of its RLHF examples); then vLLM's
        post-load step and the prefix cache dropped. On failure the engine is stale."""
        import asyncio

        from rl.engines.vllm_cuda import bucketed, layout_wire

        try:
            params = list(named_parameters)
            if self._group is None:
                device = params[0][1].device if params else torch.device("cpu")
                self._group = await self._join_weight_group(device)
            group = self._group
            for bucket, buffer in bucketed(params, self._bucket_bytes, dtype=self._dtype):
                dtype = str(buffer.dtype).removeprefix("torch.")
                receive = self._engine.collective_rpc(
                    "rl_receive_bucket", args=(bucket.numel, dtype, layout_wire(bucket))
                )
                await asyncio.gather(receive, asyncio.to_thread(group.broadcast, buffer))
                del buffer
            await self._engine.collective_rpc("rl_finish_load")
            await self._engine.reset_prefix_cache()
        except BaseException:
            self._stale = True
            raise
        self._stale = False
        self.syncs += 1

    async def aclose(self) -> None:
        """Shut vLLM down."""
        shutdown = getattr(self._engine, "shutdown", None)
        if shutdown is not None:
            shutdown()


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _platform_has_sleep_mode() -> bool:
    from vllm.platforms import current_platform  # type: ignore[import-not-found,unused-ignore]

    return bool(current_platform.is_sleep_mode_available())


def _model_dtype(engine: Any) -> torch.dtype:
    config = getattr(getattr(engine, "vllm_config", None), "model_config", None)
    dtype = getattr(config, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else torch.bfloat16


def _kv_capacity_tokens(engine: Any) -> int:
    config = getattr(engine, "vllm_config", None)
    cache = getattr(config, "cache_config", None)
    blocks = getattr(cache, "num_gpu_blocks", None)
    block_size = getattr(cache, "block_size", None)
    if not blocks or not block_size:
        raise RuntimeError("vLLM did not report its KV-cache size; set capacity_tokens")
    return int(blocks) * int(block_size)
