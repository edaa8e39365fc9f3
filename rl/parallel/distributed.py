"""Data-parallel training with PyTorch's own engine: FSDP2 (`fully_shard`) under `torchrun`.

One code path for 1 process or N: `init_from_env` starts the process group from torchrun's
variables (or does nothing without them), `shard_model` shards each transformer block and then
the LogProbModel root (embeddings, final norm and tied head gathered together), with mixed
precision, and `backward_over_ranks` runs a mini-batch's backward split over the ranks.

The loss of a micro-batch is the token sum over that micro-batch divided by the mini-batch's
token count on all ranks together, and gradients are summed over ranks (divide factor 1): so N
ranks produce the gradient one process would on the same rows. Device-agnostic: the accelerator
is `torch.accelerator`'s (CUDA and ROCm builds alike), the backend the one torch names for it
(nccl/rccl, gloo on CPU); nothing here calls torch.cuda.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from rl.logprobs import LogProbModel
from rl.parallel.microbatch import pad_plan, split_balanced, token_budget_batches
from rl.versions import check_torch


@dataclass(frozen=True, slots=True)
class Topology:
    """This process's place among the training processes."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes logs and checkpoints."""
        return self.rank == 0


def accelerator(local_rank: int) -> torch.device:
    """The local accelerator of this rank (CUDA or ROCm, XPU, ...), else the CPU."""
    if torch.accelerator.is_available():
        kind = torch.accelerator.current_accelerator()
        assert kind is not None
        device = torch.device(kind.type, local_rank % torch.accelerator.device_count())
        torch.accelerator.set_device_index(device.index)
        return device
    return torch.device("cpu")


COLLECTIVE_TIMEOUT_S = 3 * 3600.0
"""How long a collective waits for the slowest rank before the run ends (torch's NCCL default,
10 minutes, is shorter than one rank's agentic rollouts or rank 0's checkpoint can take)."""


def init_from_env(
    environ: dict[str, str] | None = None, *, timeout_s: float = COLLECTIVE_TIMEOUT_S
) -> Topology:
    """The process group from torchrun's RANK, WORLD_SIZE, LOCAL_RANK (collectives wait up to
    timeout_s for every rank); one process without them."""
    env = os.environ if environ is None else environ
    world = int(env.get("WORLD_SIZE", "1"))
    rank, local_rank = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
    if world > 1:
        check_torch()
    device = accelerator(local_rank)
    if world > 1 and not dist.is_initialized():
        backend = dist.get_default_backend_for_device(device)
        dist.init_process_group(
            backend=backend,
            device_id=device if device.type != "cpu" else None,
            timeout=timedelta(seconds=timeout_s),
        )
    return Topology(rank, world, local_rank, device)


def collective_device_for(backend: str, accelerator_device: torch.device) -> torch.device:
    """Where a process group's collectives take their tensors: gloo's on the CPU, every other
    backend's (nccl, rccl, xccl) on this rank's accelerator."""
    return torch.device("cpu") if backend == "gloo" else accelerator_device


def collective_device() -> torch.device:
    """The device of the default process group's collectives (the CPU without a group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return torch.device("cpu")
    backend = str(dist.get_backend())
    if backend == "gloo":
        return torch.device("cpu")
    kind = torch.accelerator.current_accelerator()
    assert kind is not None, f"a {backend} group without an accelerator"
    return collective_device_for(
        backend, torch.device(kind.type, torch.accelerator.current_device_index())
    )


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def transformer_blocks(lm: Any) -> list[torch.nn.Module]:
    """The repeated blocks of a transformers model (its `_no_split_modules` classes)."""
    names = set(getattr(lm, "_no_split_modules", None) or ())
    blocks = [m for m in lm.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(lm).__name__} names no transformer block class to shard")
    return blocks


def shard_model(
    model: LogProbModel,
    *,
    param_dtype: torch.dtype | None = None,
    reshard_after_forward: bool = True,
) -> LogProbModel:
    """Shard model in place with FSDP2: each block, then the root; returns it.

    param_dtype: the dtype of forwards and backwards (bfloat16 for mixed precision; None: the
    parameters' own); gradients are reduced and kept in float32 whatever it is.
    """
    check_torch()
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for block in transformer_blocks(model.lm):
        fully_shard(block, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # The root is the first unit to run a forward; the rollout engine calls the LM (a block
    # unit first) directly, so the root is initialised here, before any forward.
    model._get_fsdp_state()._lazy_init()  # type: ignore[operator]
    # Losses are divided by the global token count already: gradients must be summed, by every
    # unit. Plain SUM collectives: a divide factor alone makes FSDP use PREMUL_SUM (not in gloo).
    for unit in model.modules():
        if isinstance(unit, FSDPModule):
            unit.set_gradient_divide_factor(1.0)
            unit.set_force_sum_reduction_for_comms(True)
    return model


def all_reduce(value: float, op: str = "sum", device: torch.device | None = None) -> float:
    """A float summed (or maxed) over the ranks; itself with one process. device: None for
    the group's (collective_device); an NCCL group takes no CPU tensor."""
    if world()[1] == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device or collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return float(tensor.item())


T = TypeVar("T")


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether model is an FSDP2 unit (shard_model's result)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Every rank holds the whole (unsharded) parameters inside, and forwards issue no
    collective: ranks may run different numbers of forwards (their own rollouts), on the LM
    directly. One all-gather in, the shards back out. A plain module: nothing to do."""
    from torch.distributed.fsdp import FSDPModule

    if not is_sharded(model):
        yield
        return
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(True, recurse=False)  # shard_model's setting


def gather_objects(value: T) -> list[T]:  # noqa: UP047  (GPU hosts' Python 3.11)
    """Every rank's value, in rank order (picklable values); [value] with one process."""
    if world()[1] == 1:
        return [value]
    out: list[Any] = [None] * world()[1]
    dist.all_gather_object(out, value)
    return out


def broadcast_object(value: T) -> T:  # noqa: UP047  (GPU hosts' Python 3.11)
    """Rank 0's value on every rank."""
    if world()[1] == 1:
        return value
    box: list[Any] = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]


def barrier() -> None:
    """Wait for every rank (nothing with one process)."""
    if world()[1] > 1:
        dist.barrier()


MicroBatchLoss = Callable[[list[int]], tuple[torch.Tensor, dict[str, float]]]
"""The loss of the given rows (token sum / global token count), with its graph, and metrics
to sum over micro-batches and ranks."""


def my_micro_batches(
    lengths: Sequence[int],
    token_budget: int,
    *,
    max_rows: int = 0,
    device: torch.device | None = None,
) -> list[list[int]]:
    """This rank's share of the rows in token-budget micro-batches, padded with empty ones to
    the count of the rank with the most (each pass is a collective under FSDP)."""
    rank, size = world()
    mine = split_balanced(lengths, size)[rank]
    plan = token_budget_batches(mine, lengths, token_budget, max_rows=max_rows)
    return pad_plan(plan, int(all_reduce(float(len(plan)), "max", device)))


def backward_over_ranks(
    lengths: Sequence[int],
    token_budget: int,
    loss_of: MicroBatchLoss,
    *,
    max_rows: int = 0,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Backward of a mini-batch whose rows have these lengths, split over the ranks in
    token-budget micro-batches; returns "loss" and loss_of's metrics, summed over micro-batches
    and ranks.

    Every rank must call it with the same rows. A rank with fewer micro-batches than another
    runs zero-weight passes on row 0 (their metrics dropped), so every rank joins every
    collective.
    """
    sums: dict[str, float] = {}
    for rows in my_micro_batches(lengths, token_budget, max_rows=max_rows, device=device):
        loss, metrics = loss_of(rows or [0])
        if not rows:
            loss = loss * 0.0
            metrics = {}
        loss.backward()  # type: ignore[no-untyped-call]
        sums["loss"] = sums.get("loss", 0.0) + float(loss.detach())
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value
    return sum_over_ranks(sums, device)


def sum_over_ranks(
    values: dict[str, float], device: torch.device | None = None
) -> dict[str, float]:
    """Each key's value summed over the ranks (keys any rank has; missing ones count 0)."""
    if world()[1] == 1:
        return values
    keys = sorted({k for part in gather_objects(sorted(values)) for k in part})
    tensor = torch.tensor([values.get(k, 0.0) for k in keys], dtype=torch.float64)
    tensor = tensor.to(device or collective_device())
    dist.all_reduce(tensor)
    return dict(zip(keys, tensor.tolist(), strict=True))


def full_gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's whole gradient (gathered from the shards), by name, on the CPU."""
    grads = {}
    for name, param in model.named_parameters():
        if param.grad is None:
            continue
        grad = param.grad
        full = getattr(grad, "full_tensor", None)
        grads[name] = (full() if full is not None else grad).detach().cpu()
    return grads


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (a collective: every rank calls it); a plain one as it is."""
    full = getattr(tensor, "full_tensor", None)
    return full() if full is not None else tensor


def _shards_rows(tensor: torch.Tensor) -> Any:
    """The DTensor of a tensor sharded on dim 0 over a 1-D mesh (FSDP2's layout); else None."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(tensor, DTensor) or tensor.device_mesh.ndim != 1 or tensor.ndim == 0:
        return None
    return tensor if tuple(tensor.placements) == (Shard(0),) else None


def gather_flat(tensors: Sequence[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The tensors whole, cast to dtype, flattened end to end into one new buffer on the local
    device: the dim-0 shards of an FSDP2 model are cast first, then gathered by one all_gather
    for all of them (a collective: every rank calls it with the same tensors). Other
    DTensors are gathered one by one; plain tensors copied."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    out = torch.empty(sum(t.numel() for t in tensors), dtype=dtype, device=local[0].device)
    offsets = [0]
    for t in tensors:
        offsets.append(offsets[-1] + t.numel())
    sharded = [i for i, t in enumerate(tensors) if _shards_rows(t) is not None]
    if sharded:
        _gather_rows(tensors, local, sharded, offsets, out)
    for i, t in enumerate(tensors):
        if i not in sharded:
            whole = full_tensor(t)
            out[offsets[i] : offsets[i + 1]].copy_(whole.reshape(-1))
            del whole
    return out


def _gather_rows(
    tensors: Sequence[torch.Tensor],
    local: Sequence[torch.Tensor],
    sharded: Sequence[int],
    offsets: Sequence[int],
    out: torch.Tensor,
) -> None:
    group = _shards_rows(tensors[sharded[0]]).device_mesh.get_group()
    ranks = dist.get_world_size(group)
    # torch.chunk's split of dim 0 (FSDP2's): ceil(rows / ranks) rows each, the last ones short
    pieces = []
    for i in sharded:
        rows = tensors[i].shape[0]
        chunk = -(-rows // ranks)
        pieces.append((i, rows, chunk, tensors[i].numel() // max(rows, 1)))
    send = torch.zeros(
        sum(chunk * row for _, _, chunk, row in pieces), dtype=out.dtype, device=out.device
    )
    at = 0
    for i, _, chunk, row in pieces:
        send[at : at + local[i].numel()].copy_(local[i].reshape(-1))  # the cast, before sending
        at += chunk * row
    received = [torch.empty_like(send) for _ in range(ranks)]
    dist.all_gather(received, send, group=group)
    del send
    at = 0
    for i, rows, chunk, row in pieces:
        for rank, part in enumerate(received):
            valid = min(max(rows - rank * chunk, 0), chunk) * row
            start = offsets[i] + rank * chunk * row
            out[start : start + valid].copy_(part[at : at + valid])
        at += chunk * row


def clip_grad_norm(parameters: Sequence[torch.Tensor], max_norm: float) -> float:
    """The whole model's gradient norm, gradients scaled to at most max_norm; sharded (FSDP2)
    gradients' squares summed over their ranks explicitly, so every rank gets the full norm on
    any torch (torch 2.8's clip_grad_norm_ of sharded gradients returns the local shard's)."""
    from torch.distributed.tensor import DTensor, Shard

    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    device = grads[0].to_local().device if isinstance(grads[0], DTensor) else grads[0].device
    mine = torch.zeros((), dtype=torch.float32, device=device)  # squares of this rank's shards
    whole = torch.zeros((), dtype=torch.float32, device=device)  # squares every rank has
    group = None
    for grad in grads:
        if isinstance(grad, DTensor) and any(isinstance(p, Shard) for p in grad.placements):
            mine += grad.to_local().detach().float().pow(2).sum()
            group = grad.device_mesh.get_group()
        else:
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            whole += local.detach().float().pow(2).sum()
    if group is not None:
        dist.all_reduce(mine, group=group)
    norm = float((mine + whole).sqrt())
    scale = min(1.0, max_norm / (norm + 1e-6))
    if scale < 1.0:
        for grad in grads:
            (grad.to_local() if isinstance(grad, DTensor) else grad).mul_(scale)
    return norm
