"""The device half of the vLLM weight sync: bf16 buckets shared by IPC, no host copy.

As vLLM's RLHF colocation examples do: the trainer copies a bucket of parameters into one
contiguous bf16 buffer on its device and shares it with torch's IPC (`reduce_tensor`: a CUDA IPC
handle on a GPU, shared memory on the CPU). What crosses vLLM's msgpack boundary
(`collective_rpc`) is plain data only: the handle pickled to bytes by the trainer (opened only by
VLLMWorkerExtension, the trainer's own code in vLLM's worker, never by vLLM's decoder, so no
insecure serialization is switched on), the trainer's GPU UUID and the bucket's layout as lists.
The worker opens the buffer on the device with that UUID, loads views of it, and after the last
bucket runs vLLM's process_weights_after_loading. The trainer keeps each buffer alive until
every worker has loaded it, and gathers a sharded parameter only when its bucket is filled: at
most one bucket of whole tensors exists at a time.

Checked on the CPU (tests/rl/test_rl_vllm_fake.py: the same code, shared memory for CUDA IPC);
scripts/gpu_check.py checks the CUDA IPC handle on a GPU.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from rl.engines.vllm_sync import Bucket, buckets, checkpoint_name

Gather = Callable[[torch.Tensor], torch.Tensor]


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    full = getattr(tensor, "full_tensor", None)
    return full() if full is not None else tensor


def bucketed(
    named_parameters: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    *,
    gather: Gather = _whole,
) -> Iterator[tuple[Bucket, torch.Tensor]]:
    """(layout, flat bf16 buffer on the parameters' device) per bucket, under checkpoint names.

    A sharded (FSDP2) parameter is gathered whole (a collective: every rank iterates the same
    parameters in the same order) only while its bucket is filled, then dropped: the whole model
    never exists at once. The layout comes from the parameters' global shapes, before any gather.
    """
    params = [(checkpoint_name(name), param) for name, param in named_parameters]
    layout = buckets([(n, tuple(p.shape)) for n, p in params], bucket_bytes=bucket_bytes)
    by_name = dict(params)
    for bucket in layout:
        device = by_name[bucket.slots[0].name].device  # a DTensor's: its local shard's
        buffer = torch.empty(bucket.numel, dtype=torch.bfloat16, device=device)
        for slot in bucket.slots:
            whole = gather(by_name[slot.name].detach())
            buffer[slot.offset : slot.offset + slot.numel].copy_(whole.reshape(-1))
            del whole
        yield bucket, buffer


def device_uuid(device: torch.device) -> str | None:
    """The GPU's UUID (what survives CUDA_VISIBLE_DEVICES renumbering); None on the CPU."""
    if device.type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(device).uuid)


def share(buffer: torch.Tensor) -> bytes:
    """The buffer's IPC handle as bytes (plain data for msgpack): torch's reduction of it,
    pickled with the reductions that share storage instead of copying it."""
    from torch.multiprocessing.reductions import reduce_tensor

    handle = reduce_tensor(buffer)  # type: ignore[no-untyped-call]
    return bytes(ForkingPickler.dumps((handle, device_uuid(buffer.device))))


def open_shared(handle: bytes) -> torch.Tensor:
    """The trainer's buffer in this process: a CUDA handle opened on the local device with the
    trainer's GPU's UUID (the handle's own index is the trainer's numbering)."""
    (rebuild, args), uuid = pickle.loads(handle)  # the trainer's bytes, not a peer's
    if uuid is not None:
        args = list(args)
        args[6] = _local_index(uuid)  # rebuild_cuda_tensor's storage_device
    return rebuild(*args)  # type: ignore[no-any-return]


def _local_index(uuid: str) -> int:
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise RuntimeError(f"the trainer's GPU {uuid} is not visible to this vLLM worker")


def layout_wire(bucket: Bucket) -> list[list[Any]]:
    """The bucket's layout as plain lists (what msgpack carries)."""
    return [[s.name, list(s.shape), s.offset, s.numel] for s in bucket.slots]


def _cuda_started() -> bool:
    return torch.cuda.is_available() and bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def free_cached_memory(device: torch.device) -> None:
    """Give the caching allocator's free blocks back to the driver before vLLM wakes, so its
    weights and KV cache find the memory the update used."""
    if device.type == "cuda" and _cuda_started():
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def release_ipc(device: torch.device) -> None:
    """Free the memory of shared buffers the workers have let go of (CUDA IPC keeps a buffer
    until both sides drop it; ipc_collect reclaims it)."""
    if device.type == "cuda" and _cuda_started():
        torch.cuda.ipc_collect()  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()


class VLLMWorkerExtension:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`): loads buckets sent by IPC."""

    model_runner: Any
    model_config: Any
    device: Any

    def rl_load_bucket(self, handle: bytes, layout: list[list[Any]]) -> int:
        """Open the trainer's buffer and load its tensors; returns the count loaded. The
        arguments come as msgpack decodes them (lists, bytes)."""
        buffer = open_shared(bytes(handle))
        weights = [
            (str(name), buffer[int(offset) : int(offset) + int(numel)].view(*shape))
            for name, shape, offset, numel in layout
        ]
        self.model_runner.model.load_weights(weights=weights)
        if buffer.is_cuda:
            torch.cuda.synchronize()  # the trainer may free the buffer once every worker returns
        del weights, buffer
        return len(layout)

    def rl_finish_load(self) -> None:
        """After the last bucket: vLLM's post-load step (repacking, quantization scales)."""
        self._process_weights_after_loading()
        if _cuda_started():
            torch.cuda.synchronize()

    def _process_weights_after_loading(self) -> None:
        from vllm.model_executor.model_loader.utils import (  # type: ignore[import-not-found,unused-ignore]
            process_weights_after_loading,
        )

        process_weights_after_loading(self.model_runner.model, self.model_config, self.device)
