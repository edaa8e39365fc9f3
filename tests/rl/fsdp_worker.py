"""One rank of the gloo FSDP tests (run by torchrun from test_rl_fsdp.py), or the whole batch in
one process when started without torchrun: the same rows, the same loss, the results saved.

Modes: `grads` (one backward over the ranks: the loss and every gradient), `update` (the
trainer's update path: the policy built as the trainer builds it, one SFT step, then a GRPO
policy_update of two mini-batches in token-budget micro-batches with AdamW: the metrics and
every parameter after it; then the vLLM weight push's buckets: what they carry, the collectives
each took (their dtype) and the earlier buckets alive then; and the device of every tensor
handed to a collective).
"""

from __future__ import annotations

import random
import sys
import weakref

import torch
import torch.distributed as dist

from rl.config import GRPOConfig
from rl.engines.vllm_cuda import bucketed
from rl.grpo import MicroBatching, policy_update
from rl.logprobs import LogProbModel, pad_responses
from rl.loss import policy_loss
from rl.parallel.distributed import (
    backward_over_ranks,
    collective_device,
    full_gradients,
    full_tensor,
    init_from_env,
    shard_model,
)
from rl.run.build import build_trained
from rl.run.checkpoint import full_model_state
from rl.run.optim import grpo_optimizer, sft_optimizer
from rl.run.tiny import build_model
from rl.run.train_config import config_from_dict
from rl.run.trainer import _check_same_vocabulary
from rl.sft import SFTExample, sft_step
from rl.trajectory import Trajectory

VOCAB = 300


def tiny_lm() -> torch.nn.Module:
    return build_model(
        VOCAB,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=64,
        max_positions=128,
        eos_token_id=1,
        pad_token_id=0,
        seed=0,
    )


def rows() -> tuple[list[list[int]], list[list[int]], list[float]]:
    g = torch.Generator().manual_seed(7)
    prompts = [
        torch.randint(2, VOCAB, (int(n),), generator=g).tolist() for n in (5, 9, 3, 6, 4, 8, 2, 7)
    ]
    responses = [
        torch.randint(2, VOCAB, (int(n),), generator=g).tolist() for n in (7, 2, 11, 5, 9, 3, 6, 4)
    ]
    advantages = [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25]
    return prompts, responses, advantages


def masks_of(responses: list[list[int]]) -> list[list[int]]:
    return [[int(j % 3 != 2) for j in range(len(r))] for r in responses]  # some tokens untrained


def grads(out: str, sharded: bool) -> None:
    topology = init_from_env()
    model = LogProbModel(tiny_lm(), chunk_tokens=4)
    if sharded:
        shard_model(model)
    prompts, responses, advantages = rows()
    masks = masks_of(responses)
    total_tokens = sum(map(sum, masks))

    def loss_of(picked: list[int]) -> tuple[torch.Tensor, dict[str, float]]:
        batch = pad_responses(
            [prompts[i] for i in picked],
            [responses[i] for i in picked],
            [masks[i] for i in picked],
            pad_id=0,
        )
        logp = model(batch, 0.7)
        adv = torch.tensor([advantages[i] for i in picked])
        loss, _ = policy_loss(logp, logp.detach(), adv, batch.loss_mask, num_tokens=total_tokens)
        return loss, {"rows": float(len(picked))}

    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    sums = backward_over_ranks(lengths, 24, loss_of)  # a few rows per micro-batch
    result = {"loss": sums["loss"], "rows": sums["rows"], "grads": full_gradients(model)}
    if topology.is_main:
        torch.save({**result, "world": topology.world_size}, out)


def update(out: str) -> None:
    topology = init_from_env()
    config = config_from_dict(
        {
            "name": "fsdp",
            "trainer": {"micro_batch_tokens": 30, "micro_batch_size": 3, "minibatches": 2},
            "grpo": {"max_response_tokens": 64},
            "stages": [{"name": "rl", "kind": "grpo", "steps": 1}],
        }
    )
    policy = build_trained(config, tiny_lm(), topology.device, topology.world_size)
    prompts, responses, advantages = rows()
    masks = masks_of(responses)
    # SFT: one step of token-mean NLL over every example.
    examples = [SFTExample(p, r, m) for p, r, m in zip(prompts, responses, masks, strict=True)]
    sft_opt, _ = sft_optimizer(policy, lr=1e-2, weight_decay=0.0, warmup=1, total=1)
    sft = sft_step(policy, sft_opt, examples, pad_id=0, micro_batch_size=3, micro_batch_tokens=30)
    # GRPO: old log-probs recomputed, two mini-batches of whole groups in a shuffled order.
    g = torch.Generator().manual_seed(3)
    trajectories = [
        Trajectory(
            p,
            r,
            m,
            (torch.rand(len(r), generator=g) * -2).tolist(),
            group=i // 2,
        )
        for i, (p, r, m) in enumerate(zip(prompts, responses, masks, strict=True))
    ]
    optimizer, _ = grpo_optimizer(policy, lr=1e-2, weight_decay=0.01, warmup=0)
    metrics = policy_update(
        policy,
        optimizer,
        trajectories,
        advantages,
        GRPOConfig(),
        pad_id=0,
        batching=MicroBatching(config.trainer.micro_batch_tokens, config.trainer.micro_batch_size),
        minibatches=config.trainer.minibatches,
        temperature=0.7,
        rng=random.Random(5),
    )
    params = {n: full_tensor(p.detach()).cpu() for n, p in policy.named_parameters()}
    state = full_model_state(policy)
    push = pushed_buckets(policy)
    _check_same_vocabulary(type("Tok", (), {"get_vocab": lambda self: {"a": 0}})())
    if topology.is_main:
        result = {"sft": sft, "metrics": metrics, "params": params, "state_keys": sorted(state)}
        result |= push | {
            "collective_devices": sorted(SEEN),
            "group_device": str(collective_device()),
        }
        torch.save({**result, "world": topology.world_size}, out)


def pushed_buckets(policy: torch.nn.Module) -> dict[str, object]:
    """The weight push's buckets (rl.engines.vllm_cuda.bucketed) decoded by their layouts, the
    all_gathers each bucket took, and how many earlier buckets were alive at each all_gather."""
    earlier: list[weakref.ref[torch.Tensor]] = []
    GATHERED.clear()
    ALIVE_AT_GATHER.clear()
    ALIVE_AT_GATHER.append(lambda: sum(ref() is not None for ref in earlier))
    pushed, gathers, slots = {}, [], []
    before = 0
    for bucket, buffer in bucketed(policy.named_parameters(), 4 << 10, dtype=torch.bfloat16):
        gathers.append(len(GATHERED) - before)
        before = len(GATHERED)
        slots.append(len(bucket.slots))
        for slot in bucket.slots:
            view = buffer[slot.offset : slot.offset + slot.numel].view(slot.shape)
            pushed[slot.name] = view.clone().cpu()
        earlier.append(weakref.ref(buffer))
        del buffer, view
    return {
        "pushed": pushed,
        "gathers_per_bucket": gathers,
        "gathered": list(GATHERED),
        "bucket_slots": slots,
    }


def uneven(out: str) -> None:
    """rl.parallel.distributed.gather_flat over 3 ranks, of dim-0 shards that torch.chunk splits
    unevenly (a rank with an empty shard included) beside a plain tensor: the whole tensors,
    cast to bf16, end to end, by one all_gather."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from rl.parallel.distributed import gather_flat

    topology = init_from_env()
    mesh = init_device_mesh("cpu", (topology.world_size,))
    g = torch.Generator().manual_seed(11)
    shapes = [(5, 4), (1, 3), (7,), (2, 2, 2), (4, 3)]
    whole = [torch.randn(shape, generator=g) for shape in shapes]
    tensors = [distribute_tensor(t, mesh, [Shard(0)]) for t in whole[:-1]] + [whole[-1]]
    GATHERED.clear()
    flat = gather_flat(tensors, torch.bfloat16)
    expected = torch.cat([t.reshape(-1) for t in whole]).bfloat16()
    if topology.is_main:
        torch.save(
            {
                "equal": torch.equal(flat, expected),
                "dtype": str(flat.dtype),
                "gathers": list(GATHERED),
                "locals": [t.to_local().shape[0] for t in tensors[:-1]],
                "world": topology.world_size,
            },
            out,
        )


GATHERED: list[tuple[str, int]] = []
"""(dtype, earlier push buckets alive) of each all_gather call (the push's collective)."""
ALIVE_AT_GATHER: list[object] = []


SEEN: set[str] = set()
"""The device of every tensor the run handed to a collective (wrapped below)."""


def _wrap_collectives() -> None:
    for name in (
        "all_reduce",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
    ):
        real = getattr(dist, name)

        def wrapped(
            *args: object, _real: object = real, _name: str = name, **kwargs: object
        ) -> object:
            for value in [*args[:2], *kwargs.values()]:
                if isinstance(value, torch.Tensor):
                    SEEN.add(str(value.device))
            if _name == "all_gather" and isinstance(args[1], torch.Tensor):
                alive = ALIVE_AT_GATHER[0]() if ALIVE_AT_GATHER else 0  # type: ignore[operator]
                GATHERED.append((str(args[1].dtype), int(alive)))
            return _real(*args, **kwargs)  # type: ignore[operator]

        setattr(dist, name, wrapped)


if __name__ == "__main__":
    _wrap_collectives()
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "grads":
        grads(path, sharded="--fsdp" in sys.argv)
    elif mode == "uneven":
        uneven(path)
    else:
        update(path)
    if dist.is_initialized():
        dist.barrier()  # no rank tears gloo down while another still has work in flight
        dist.destroy_process_group()
