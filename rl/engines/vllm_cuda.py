"""The device half of the vLLM weight sync: buckets in the engine's dtype, shared by IPC.

As vLLM's RLHF colocation examples do: the trainer copies a bucket of parameters into one
contiguous buffer of the engine's dtype on its device and shares it with torch's IPC
(`reduce_tensor`: a CUDA IPC handle on a GPU, shared memory on the CPU). What crosses vLLM's
msgpack boundary (`collective_rpc`) is plain data only: the handle pickled to bytes by the trainer
(opened only by VLLMWorkerExtension, the trainer's own code in vLLM's worker, never by vLLM's
decoder, so no insecure serialization is switched on), the trainer's GPU UUID and the bucket's
layout as lists. The worker opens the buffer on the device with that UUID, loads views of it, and
after the last bucket runs vLLM's process_weights_after_loading. The trainer keeps each buffer
alive until every worker has loaded it, and gathers a bucket's sharded parameters (cast to the
engine's dtype first, one collective for the bucket) only when that bucket is filled: at most one
bucket of whole tensors exists at a time.

Checked on the CPU (tests/rl/test_rl_vllm_fake.py: the same code, shared memory for CUDA IPC);
scripts/gpu_check.py checks the CUDA IPC handle on a GPU.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from rl.engines.vllm_sync import Bucket, buckets, checkpoint_name
from rl.parallel.distributed import gather_flat


def bucketed(
    named_parameters: Iterable[tuple[str, torch.Tensor]],
    bucket_bytes: int,
    *,
    dtype: torch.dtype,
) -> Iterator[tuple[Bucket, torch.Tensor]]:
    """(layout, flat buffer of dtype, the engine's, on the parameters' device) per bucket, under
    checkpoint names.

    Sharded (FSDP2) parameters are cast to dtype on their shards and gathered whole by one
    collective per bucket (every rank iterates the same parameters in the same order), only while
    their bucket is filled: the whole model never exists at once. The layout comes from the
    parameters' global shapes, before any gather. The generator drops its reference to a bucket
    before filling the next one: once the caller drops its own, one bucket is alive at a time.
    """
    params = [(checkpoint_name(name), param.detach()) for name, param in named_parameters]
    layout = buckets(
        [(n, tuple(p.shape)) for n, p in params],
        bucket_bytes=bucket_bytes,
        element_bytes=dtype.itemsize,
    )
    by_name = dict(params)
    del params
    for bucket in layout:
        buffer = gather_flat([by_name[slot.name] for slot in bucket.slots], dtype)
        yield bucket, buffer
        del buffer


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


class WeightGroup:
    """A broadcast group between the trainer (rank 0) and an engine's workers on GPUs of their
    own (the placement without sleep mode): vLLM's weight-update path of its RLHF examples, a
    StatelessProcessGroup with vLLM's PyNccl communicator (NCCL, RCCL on ROCm); on the CPU a gloo
    group over a TCP store, which the tests run."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, device: torch.device):
        self._device = device
        if device.type == "cpu":
            from datetime import timedelta

            import torch.distributed as dist

            store = dist.TCPStore(host, port, world_size, is_master=rank == 0)  # type: ignore[attr-defined,unused-ignore]
            self._gloo: Any = dist.ProcessGroupGloo(store, rank, world_size, timedelta(hours=3))
            return
        from vllm.distributed.device_communicators.pynccl import (  # type: ignore[import-not-found,unused-ignore]
            PyNcclCommunicator,
        )
        from vllm.distributed.utils import (  # type: ignore[import-not-found,unused-ignore]
            StatelessProcessGroup,
        )

        group = StatelessProcessGroup.create(host=host, port=port, rank=rank, world_size=world_size)
        self._nccl: Any = PyNcclCommunicator(group, device=device)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """The trainer's tensor into every member's (rank 0 sends, the others receive)."""
        if self._device.type == "cpu":
            import torch.distributed as dist

            options = dist.BroadcastOptions()
            options.rootRank = 0
            self._gloo.broadcast([tensor], options).wait()
            return
        self._nccl.broadcast(tensor, src=0, stream=torch.cuda.current_stream())
        torch.cuda.synchronize(self._device)


class WeightReceiver:
    """Mixed into vLLM's worker beside VLLMWorkerExtension: the receiving side of WeightGroup."""

    model_runner: Any
    device: Any
    rank: int
    _weight_group: WeightGroup

    def rl_init_weight_group(self, host: str, port: int, world_size: int) -> int:
        """Join the trainer's weight group as rank 1 + this worker's rank; returns that rank."""
        rank = 1 + int(getattr(self, "rank", 0))
        self._weight_group = WeightGroup(str(host), int(port), rank, int(world_size), self.device)
        return rank

    def rl_receive_bucket(self, numel: int, dtype: str, layout: list[list[Any]]) -> int:
        """Receive one bucket broadcast by the trainer and load its tensors; returns the count."""
        buffer = torch.empty(int(numel), dtype=getattr(torch, str(dtype)), device=self.device)
        self._weight_group.broadcast(buffer)
        weights = [
            (str(name), buffer[int(offset) : int(offset) + int(numel_)].view(*shape))
            for name, shape, offset, numel_ in layout
        ]
        self.model_runner.model.load_weights(weights=weights)
        del weights, buffer
        return len(layout)


class VLLMWorkerExtension(WeightReceiver):
    """Mixed into vLLM's GPU worker (`worker_extension_cls`): loads buckets sent by IPC (the
    colocated placement) or broadcast to it (WeightReceiver's methods, the separate one)."""

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
