"""The one version set the GPU path is written against, and the start-up check that names what
an installed torch or vLLM lacks (instead of an AttributeError deep in a run).

    vLLM 0.11.0 (V1 engine) with torch 2.8.0 and transformers 4.56-4.57: the `vllm` extra.
    The `rl` extra alone: torch >= 2.8, transformers >= 4.56 (CI runs the newest of both).

Chosen over the newest vLLM because 0.11.0's engine, worker and serializer sources are the
ones this code was read against (collective_rpc over the V1 msgpack encoder, worker_extension_cls,
sleep mode with tags, logprobs_mode, process_weights_after_loading); the newest release
moved weight transfer to its own API and pins torch and transformers of its own.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

VLLM_VERSION = "0.11.0"
VLLM_TORCH = "2.8.0"
TORCH_FLOOR = "2.8"

_TORCH_API: tuple[tuple[str, str], ...] = (
    ("torch.accelerator", "current_accelerator"),
    ("torch.accelerator", "device_count"),
    ("torch.accelerator", "set_device_index"),
    ("torch.accelerator", "current_device_index"),
    ("torch.distributed", "get_default_backend_for_device"),
    ("torch.distributed.fsdp", "fully_shard"),
    ("torch.distributed.fsdp", "MixedPrecisionPolicy"),
    ("torch.distributed.fsdp.FSDPModule", "set_gradient_divide_factor"),
    ("torch.distributed.fsdp.FSDPModule", "set_force_sum_reduction_for_comms"),
    ("torch.distributed.fsdp.FSDPModule", "set_reshard_after_forward"),
    ("torch.multiprocessing.reductions", "reduce_tensor"),
)
"""What rl/parallel and the weight push call (torch 2.8 has every one)."""

_VLLM_API: tuple[tuple[str, str], ...] = (
    ("vllm", "AsyncEngineArgs"),
    ("vllm", "AsyncLLMEngine"),
    ("vllm", "SamplingParams"),
    ("vllm.inputs", "TokensPrompt"),
    ("vllm.AsyncLLMEngine", "from_engine_args"),
    ("vllm.AsyncLLMEngine", "generate"),
    ("vllm.AsyncLLMEngine", "collective_rpc"),
    ("vllm.AsyncLLMEngine", "sleep"),
    ("vllm.AsyncLLMEngine", "wake_up"),
    ("vllm.AsyncLLMEngine", "reset_prefix_cache"),
    ("vllm.model_executor.model_loader.utils", "process_weights_after_loading"),
    ("vllm.platforms.current_platform", "is_sleep_mode_available"),
    # the separate placement's weight-update group (vLLM's RLHF examples)
    ("vllm.distributed.utils.StatelessProcessGroup", "create"),
    ("vllm.distributed.device_communicators.pynccl.PyNcclCommunicator", "broadcast"),
)
_VLLM_ENGINE_ARGS = ("enable_sleep_mode", "logprobs_mode", "worker_extension_cls")


def _resolve(path: str, importer: Any) -> Any:
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importer(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def missing(required: tuple[tuple[str, str], ...], importer: Any) -> list[str]:
    """The dotted names of required (owner, attribute) pairs that are not there."""
    out = []
    for owner, attr in required:
        try:
            found = hasattr(_resolve(owner, importer), attr)
        except (ImportError, AttributeError):
            found = False
        if not found:
            out.append(f"{owner}.{attr}")
    return out


def _import(name: str) -> ModuleType:
    import importlib

    return importlib.import_module(name)


def check_torch(importer: Any = _import) -> None:
    """Raise naming every torch API the trainer's parallel path needs and this torch lacks."""
    gone = missing(_TORCH_API, importer)
    if gone:
        raise RuntimeError(
            f"this torch lacks {', '.join(gone)}: the rl extra needs torch >= {TORCH_FLOOR}"
        )


def check_vllm(importer: Any = _import) -> None:
    """Raise naming every vLLM API VLLMEngine needs and the installed vLLM lacks."""
    try:
        importer("vllm")
    except ImportError:
        raise RuntimeError(
            f"vllm is not installed: VLLMEngine needs the `vllm` extra (vLLM {VLLM_VERSION})"
        ) from None
    gone = missing(_VLLM_API, importer)
    try:
        import dataclasses

        args = importer("vllm").AsyncEngineArgs
        fields = {f.name for f in dataclasses.fields(args)}
        gone += [f"AsyncEngineArgs.{a}" for a in _VLLM_ENGINE_ARGS if a not in fields]
    except (ImportError, AttributeError, TypeError):
        pass  # already named above
    if gone:
        raise RuntimeError(
            f"this vLLM lacks {', '.join(gone)}: VLLMEngine is written against vLLM "
            f"{VLLM_VERSION} (torch {VLLM_TORCH}); install the `vllm` extra"
        )
