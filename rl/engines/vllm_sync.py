"""The pure half of pushing the trainer's weights into vLLM: names, buckets, when (no torch).

    trainer parameters --names()--> checkpoint names --buckets()--> bf16 buckets of <= N bytes
    each bucket: one contiguous buffer, shared by CUDA IPC (engines/vllm_cuda.py), loaded by
    vLLM's worker as (name, view) pairs

`SYNC_POINTS` says when the engines get the policy's weights: after every update, after an SFT
stage (else the first GRPO rollouts come from pre-SFT weights) and at the start of every GRPO
stage (a resumed or re-loaded policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod

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
    (`steps_with_update[i]` updates in stage i), an SFT stage once at its end."""
    calls: list[str] = []
    for kind, updates in zip(stage_kinds, steps_with_update, strict=True):
        if kind == "sft":
            calls.append("after_sft")
        else:
            calls.append("stage_start")
            calls.extend(["after_update"] * updates)
    return calls
