"""One rank of the gloo FSDP test (run by torchrun from test_rl_fsdp.py), or the whole batch in
one process when started without torchrun: the same rows, the same loss, its gradients saved."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from rl.logprobs import LogProbModel, pad_responses
from rl.loss import policy_loss
from rl.parallel.distributed import (
    backward_over_ranks,
    full_gradients,
    init_from_env,
    shard_model,
)
from rl.run.tiny import build_model

VOCAB = 300


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


def main(out: str, sharded: bool) -> None:
    topology = init_from_env()
    lm = build_model(
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
    model = LogProbModel(lm, chunk_tokens=4)
    if sharded:
        shard_model(model)
    prompts, responses, advantages = rows()
    masks = [[int(j % 3 != 2) for j in range(len(r))] for r in responses]  # some tokens untrained
    total_tokens = sum(map(sum, masks))

    def loss_of(picked: list[int]) -> torch.Tensor:
        batch = pad_responses(
            [prompts[i] for i in picked],
            [responses[i] for i in picked],
            [masks[i] for i in picked],
            pad_id=0,
        )
        logp = model(batch, 0.7)
        adv = torch.tensor([advantages[i] for i in picked])
        loss, _ = policy_loss(logp, logp.detach(), adv, batch.loss_mask, num_tokens=total_tokens)
        return loss

    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    loss = backward_over_ranks(lengths, 24, loss_of)  # a few rows per micro-batch
    grads = full_gradients(model)
    if topology.is_main:
        torch.save({"loss": loss, "grads": grads, "world": topology.world_size}, out)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sharded="--fsdp" in sys.argv)
