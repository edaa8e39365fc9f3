"""FSDP2 on 2 CPU processes (gloo, under torchrun) gives the loss and gradients of 1 process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl.logprobs import LogProbModel, pad_responses, response_logprobs
from rl.parallel.microbatch import pad_plan, split_balanced, token_budget_batches

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("fsdp_worker.py")


def _run(args: list[str], tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    env.pop("WORLD_SIZE", None)
    subprocess.run(args, check=True, env=env, cwd=tmp_path, timeout=240)


@pytest.mark.slow
@pytest.mark.timeout(540)
def test_two_gloo_ranks_give_the_loss_and_gradients_of_one_process(tmp_path: Path) -> None:
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    _run([sys.executable, str(WORKER), str(one)], tmp_path)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    _run([*torchrun, "--standalone", str(WORKER), str(two), "--fsdp"], tmp_path)
    single, sharded = torch.load(one), torch.load(two)
    assert (single["world"], sharded["world"]) == (1, 2)
    assert abs(single["loss"] - sharded["loss"]) < 1e-6
    assert set(single["grads"]) == set(sharded["grads"]) and single["grads"]
    for name, grad in single["grads"].items():
        assert torch.allclose(grad, sharded["grads"][name], atol=1e-6, rtol=1e-4), name
    assert any(float(g.abs().sum()) > 0 for g in single["grads"].values())


def test_chunked_logprobs_equal_a_full_log_softmax() -> None:
    from rl.run.tiny import build_model

    lm = build_model(
        300,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=64,
        max_positions=128,
        eos_token_id=1,
        pad_token_id=0,
        seed=0,
    )
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 300, (n,), generator=g).tolist() for n in (5, 9, 3)]
    responses = [torch.randint(2, 300, (n,), generator=g).tolist() for n in (7, 2, 11)]
    batch = pad_responses(prompts, responses, [[1] * len(r) for r in responses], pad_id=0)
    # The reference: every position's full-vocabulary logits, one log-softmax.
    logits = lm(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    expected = torch.zeros(3, 11)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        logp = torch.log_softmax(logits[i, len(p) - 1 : len(p) - 1 + len(r)] / 0.7, dim=-1)
        expected[i, : len(r)] = logp.gather(-1, torch.tensor(r).unsqueeze(-1)).squeeze(-1)
    chunked = LogProbModel(lm, chunk_tokens=3)(batch, 0.7)
    assert torch.allclose(chunked, expected, atol=1e-5)
    assert torch.allclose(response_logprobs(lm, batch, temperature=0.7), expected, atol=1e-5)


def test_ranks_get_balanced_rows_and_equally_many_micro_batches() -> None:
    lengths = [100, 90, 80, 10, 10, 10, 5]
    parts = split_balanced(lengths, 2)
    assert sorted(i for p in parts for i in p) == list(range(7))
    loads = [sum(lengths[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= max(lengths)
    plans = [token_budget_batches(p, lengths, 100) for p in parts]
    for plan in plans:
        for rows in plan:
            assert len(rows) == 1 or len(rows) * max(lengths[i] for i in rows) <= 100
    count = max(len(p) for p in plans)
    assert all(len(pad_plan(p, count)) == count for p in plans)
