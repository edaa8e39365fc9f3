"""The pure half of pushing the trainer's weights into vLLM: names, buckets, when (no torch).

    trainer parameters --names()--> checkpoint names --buckets()--> bf16 buckets of <= N bytes
    each bucket: one contiguous buffer, shared by CUDA IPC (engines/vllm_cuda.py), loaded by
    vLLM's worker as (name, view) pairs

`SYNC_POINTS` says when the engines get the policy's weights: after every update, after an SFT
stage (else the first GRPO rollouts come from pre-SFT weights) and at the start of every GRPO
stage (a resumed or re-loaded policy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Literal

# Wrappers put these in front of a transformers model's own parameter names.
_PREFIXES = ("lm.", "_orig_mod.", "_fsdp_wrapped_module.", "module.")


def checkpoint_name(trainer_name: str) -> str:
    """The transformers checkpoint name (what vLLM's load_weights reads) of a trainer parameter:
    wrapper prefixes (LogProbModel's `lm.`, torch.compile's, DDP's) removed."""
    name = trainer_name
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix) :], True
    return name.replace("._fsdp_wrapped_module", "").replace("._orig_mod", "")


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one tensor sits in its bucket's flat buffer (elements, not bytes)."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


@dataclass(frozen=True, slots=True)
class Bucket:
    """Tensors sent together in one flat buffer."""

    slots: tuple[Slot, ...]
    numel: int


def buckets(
    params: Sequence[tuple[str, tuple[int, ...]]], *, bucket_bytes: int, element_bytes: int = 2
) -> list[Bucket]:
    """Group (name, shape) pairs, in order, into buckets of at most bucket_bytes (a tensor larger
    than that gets a bucket of its own); element_bytes 2 for bf16."""
    if bucket_bytes < element_bytes:
        raise ValueError("bucket_bytes must hold at least one element")
    out: list[Bucket] = []
    slots: list[Slot] = []
    used = 0
    for name, shape in params:
        numel = prod(shape)
        if slots and (used + numel) * element_bytes > bucket_bytes:
            out.append(Bucket(tuple(slots), used))
            slots, used = [], 0
        slots.append(Slot(name, tuple(shape), used, numel))
        used += numel
    if slots:
        out.append(Bucket(tuple(slots), used))
    return out


SyncPoint = str
SYNC_POINTS: tuple[SyncPoint, ...] = ("after_update", "after_sft", "stage_start")


def syncs_for(stage_kinds: Sequence[str], steps_with_update: Sequence[int]) -> list[str]:
    """The sync calls of a run, in order: a GRPO stage syncs at its start and after each update
    (`steps_with_update[i]` updates in stage i), an SFT stage once at its end; a sync is skipped
    when the weights are those of the last one (the engine loaded the run's starting weights, so
    a first GRPO stage starts without one, and one right after an SFT stage's is not repeated)."""
    calls: list[str] = []
    changed = False  # the policy's weights differ from the engines'
    for kind, updates in zip(stage_kinds, steps_with_update, strict=True):
        if kind == "sft":
            calls.append("after_sft")
            changed = False
            continue
        if changed:
            calls.append("stage_start")
        calls.extend(["after_update"] * updates)
        changed = False
    return calls


def engine_visible_devices(
    visible: str | None, local_rank: int, world_size: int, tensor_parallel_size: int
) -> str:
    """CUDA_VISIBLE_DEVICES for a rank's vLLM engine: the rank's own device (rank r of a node
    trains on its r-th visible device, and the CUDA IPC buffers live there); one process may span
    tensor_parallel_size devices, its training device first. Devices of a node are shared out one
    per rank: a rank's engine cannot span more than its own."""
    if tensor_parallel_size < 1:
        raise ValueError("tensor_parallel_size must be at least 1")
    if world_size > 1 and tensor_parallel_size > 1:
        raise ValueError(
            "under torchrun each rank's vLLM engine runs on that rank's GPU: "
            "tensor_parallel_size must be 1"
        )
    devices = [d.strip() for d in visible.split(",")] if visible else None
    if world_size > 1:
        # the trainer's device (rl.parallel.distributed.accelerator): local_rank modulo the
        # visible count, so one GPU bound to each process (visible "3" for local rank 3) works
        return devices[local_rank % len(devices)] if devices else str(local_rank)
    if devices is None:
        return ",".join(str(i) for i in range(tensor_parallel_size))
    if len(devices) < tensor_parallel_size:
        raise ValueError(f"tensor_parallel_size {tensor_parallel_size} > visible devices {visible}")
    return ",".join(devices[:tensor_parallel_size])


def engine_environment(
    environ: Mapping[str, str],
    *,
    local_rank: int,
    world_size: int,
    rank: int,
    tensor_parallel_size: int,
) -> dict[str, str]:
    """The variables a rank's vLLM engine starts under (its processes read them):

    - CUDA_VISIBLE_DEVICES narrowed to the engine's devices (engine_visible_devices), and
      HIP_VISIBLE_DEVICES to the same value where it is set (vLLM's ROCm platform asserts the
      two are equal; HIP's runtime reads HIP_VISIBLE_DEVICES first, so it is the list narrowed);
    - VLLM_CACHE_ROOT one directory per rank under torchrun: every engine of a node is vLLM's
      "rank 0", and engines sharing one compile cache write the same files at once
      (vllm-project/vllm#24601, fixed after 0.11.0)."""
    hip = environ.get("HIP_VISIBLE_DEVICES")
    visible = hip if hip is not None else environ.get("CUDA_VISIBLE_DEVICES")
    devices = engine_visible_devices(visible, local_rank, world_size, tensor_parallel_size)
    out = {"CUDA_VISIBLE_DEVICES": devices}
    if hip is not None:
        out["HIP_VISIBLE_DEVICES"] = devices
    if world_size > 1:
        root = environ.get("VLLM_CACHE_ROOT") or str(Path.home() / ".cache" / "vllm")
        out["VLLM_CACHE_ROOT"] = str(Path(root) / f"rank{rank}")
    return out


def check_allocator_config(environ: Mapping[str, str]) -> None:
    """vLLM's sleep mode allocates through its own memory pool, which refuses the caching
    allocator's expandable segments: refuse them before vLLM starts, in PYTORCH_CUDA_ALLOC_CONF
    and in ROCm's PYTORCH_HIP_ALLOC_CONF alike (ROCm builds of torch read either)."""
    for variable in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for option in (environ.get(variable) or "").split(","):
            key, _, value = option.partition(":")
            if key.strip() == "expandable_segments" and value.strip().lower() == "true":
                raise ValueError(
                    f"{variable} has expandable_segments:True, which vLLM's sleep mode cannot "
                    "run with: unset it (or set expandable_segments:False) for a vLLM run"
                )


def check_logprob_match(top_p: float) -> None:
    """vLLM's processed log-probs are those after top-p truncation and renormalisation; the
    trainer recomputes them over the whole vocabulary (temperature applied). They agree only
    when top_p is 1: anything else is refused rather than trained on mismatched ratios."""
    if top_p < 1.0:
        raise ValueError(
            f"top_p = {top_p}: vLLM's log-probs would be of the truncated distribution, the "
            "trainer's of the whole one; use top_p = 1 with vLLM engines"
        )


Placement = Literal["colocated", "separate"]
"""Where a vLLM engine runs: colocated on the trainer's GPU (sleep mode frees it during the
update; weights by IPC), or separate, on GPUs of its own (no sleep mode; weights broadcast)."""


def check_placement(
    placement: str,
    *,
    vllm_version: str,
    sleep_mode: bool,
    world_size: int,
    engine_devices: str,
    tensor_parallel_size: int,
) -> None:
    """Refuse, before vLLM starts, a placement that cannot work here."""
    if placement == "colocated":
        if not sleep_mode:
            raise ValueError(
                f"vLLM {vllm_version} has no sleep mode on this platform, and a colocated vLLM "
                'engine needs it to give the GPU to the update: set placement = "separate" '
                "with engine_devices (GPUs of the engine's own), install a vLLM release whose "
                "platform reports sleep mode here (docs/rl.md, 'ROCm'), or use the transformers "
                "engine"
            )
        if engine_devices:
            raise ValueError('engine_devices is for placement = "separate" only')
        return
    if placement != "separate":
        raise ValueError(f'placement {placement!r}: expected "colocated" or "separate"')
    if world_size > 1:
        raise ValueError(
            'placement = "separate" runs in one trainer process (its engine on GPUs of its '
            "own); under torchrun every rank's engine is colocated on that rank's GPU"
        )
    devices = [d.strip() for d in engine_devices.split(",") if d.strip()]
    if len(devices) != tensor_parallel_size:
        raise ValueError(
            f'placement = "separate" needs engine_devices naming the engine\'s '
            f"{tensor_parallel_size} GPU(s) (tensor_parallel_size), got {engine_devices!r}"
        )


def separate_environment(environ: Mapping[str, str], engine_devices: str) -> dict[str, str]:
    """The separate placement's engine: its own GPUs, named as the trainer's process numbers
    them (indices into its HIP_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES, when set), never the
    trainer's own (device 0 of the visible ones)."""
    hip = environ.get("HIP_VISIBLE_DEVICES")
    visible = hip if hip is not None else environ.get("CUDA_VISIBLE_DEVICES")
    listed = [d.strip() for d in visible.split(",")] if visible else None
    wanted = [int(d) for d in engine_devices.split(",") if d.strip()]
    if 0 in wanted:
        raise ValueError("engine_devices must not include device 0: the trainer's GPU")
    if listed is not None and max(wanted) >= len(listed):
        raise ValueError(f"engine_devices {engine_devices!r}: only {len(listed)} devices visible")
    devices = ",".join(listed[i] if listed is not None else str(i) for i in wanted)
    out = {"CUDA_VISIBLE_DEVICES": devices}
    if hip is not None:
        out["HIP_VISIBLE_DEVICES"] = devices
    return out
