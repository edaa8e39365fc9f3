"""The CUDA half of the vLLM weight sync: bf16 buckets shared by CUDA IPC, no host copy.

The only module of rl/ with CUDA-specific calls (ROCm builds answer to the same API). As vLLM's
RLHF colocation examples do: the trainer copies a bucket of parameters into one contiguous bf16
buffer on its GPU and sends a CUDA IPC handle of it (torch's `reduce_tensor`) through
`collective_rpc`; the arguments that cross vLLM's msgpack are the handle's small tuple and the
bucket's layout (names, shapes, offsets), never tensor data. vLLM's worker (VLLMWorkerExtension,
mixed in by `worker_extension_cls`) opens the handle on its own device and loads views of the
buffer. The trainer keeps the buffer alive until every worker has loaded it.

NOT run in this repository's CI (no GPU): scripts/gpu_check.sh checks it on a GPU host.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from rl.engines.vllm_sync import Bucket, buckets, checkpoint_name


def bucketed(
    named_parameters: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[tuple[Bucket, torch.Tensor]]:
    """(layout, flat bf16 buffer on the parameters' device) per bucket; full tensors gathered
    from FSDP shards first."""
    params = []
    for name, param in named_parameters:
        full = getattr(param, "full_tensor", None)
        tensor = (full() if full is not None else param).detach()
        params.append((checkpoint_name(name), tensor))
    layout = buckets([(n, tuple(t.shape)) for n, t in params], bucket_bytes=bucket_bytes)
    by_name = dict(params)
    for bucket in layout:
        first = by_name[bucket.slots[0].name]
        buffer = torch.empty(bucket.numel, dtype=torch.bfloat16, device=first.device)
        for slot in bucket.slots:
            buffer[slot.offset : slot.offset + slot.numel].copy_(by_name[slot.name].reshape(-1))
        yield bucket, buffer


def ipc_handle(buffer: torch.Tensor) -> Any:
    """A picklable handle of a CUDA buffer for another process on the same GPU."""
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(buffer)  # type: ignore[no-untyped-call]


def layout_wire(bucket: Bucket) -> list[list[Any]]:
    """The bucket's layout as plain lists (what msgpack carries)."""
    return [[s.name, list(s.shape), s.offset, s.numel] for s in bucket.slots]


class VLLMWorkerExtension:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`): loads buckets sent by IPC."""

    model_runner: Any
    device: Any

    def rl_load_bucket(self, handle: Any, layout: list[list[Any]]) -> None:
        """Open the trainer's buffer on this worker's device and load its tensors."""
        rebuild, args = handle
        args = list(args)
        args[6] = self.device.index  # the handle names the trainer's device; open it on ours
        buffer = rebuild(*args)
        weights = [
            (name, buffer[offset : offset + numel].view(*shape))
            for name, shape, offset, numel in layout
        ]
        self.model_runner.model.load_weights(weights=weights)
        torch.cuda.synchronize()  # the trainer may free the buffer once every worker returns
