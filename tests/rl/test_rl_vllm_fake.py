"""VLLMEngine against a double of vLLM with vLLM's process boundary and sleep semantics
(fake_vllm.py): the real weight sync and worker extension inside a tiny SFT + GRPO-RoC run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_vllm import API, EngineDeadError, FakeAsyncLLM
from rl_tiny import tiny_policy
from test_rl_train_run import NO_SANDBOX, resume_settings

from rl.engines.base import SamplingParams
from rl.engines.vllm_colocated import VLLMEngine
from rl.engines.vllm_sync import checkpoint_name, syncs_for
from rl.parallel.distributed import Topology
from rl.reward.verifier import VerifierPool
from rl.rollout.scheduler import RolloutScheduler
from rl.run.records import Recorder
from rl.run.train_config import config_from_dict
from rl.run.trainer import build_context, run_stages
from trainer_client.client import SandboxClient

pytestmark = pytest.mark.slow

BUCKET_BYTES = 16 << 10  # several buckets for the tiny model


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A tiny model directory, as vLLM loads one."""
    tokenizer, model, _ = tiny_policy()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    return tmp_path / "model"


@pytest.fixture
def fake(model_dir: Path) -> Iterator[FakeAsyncLLM]:
    engine = FakeAsyncLLM(str(model_dir))
    yield engine
    engine.shutdown()


def vllm_engine(fake: FakeAsyncLLM) -> VLLMEngine:
    return VLLMEngine(fake, name="vllm0", capacity_tokens=8192, bucket_bytes=BUCKET_BYTES, api=API)


PARAMS = SamplingParams(max_new_tokens=4, temperature=1.0)


async def test_generate_is_refused_asleep_and_a_failed_sync_leaves_a_known_state(
    fake: FakeAsyncLLM, model_dir: Path
) -> None:
    from transformers import AutoModelForCausalLM

    engine = vllm_engine(fake)
    assert len((await engine.generate([1, 2, 3], PARAMS)).token_ids) >= 1
    await engine.release_memory()
    with pytest.raises(EngineDeadError, match="asleep"):
        await engine.generate([1, 2, 3], PARAMS)
    trainer = AutoModelForCausalLM.from_pretrained(model_dir)
    good = list(trainer.named_parameters())
    bad = [*good[:1], ("model.no_such.weight", torch.zeros(3)), *good[1:]]
    with pytest.raises(EngineDeadError, match="no_such"):
        await engine.sync_weights(bad)
    assert fake.calls[-1] == ("sleep", 2)  # back asleep: the next sync wakes it from there
    # The failure came after the weights woke, with the KV cache still asleep: vLLM ignores a
    # sleep while any tag sleeps, so the engine wakes the KV cache first, and the weights are
    # freed (a stale engine holding its weights would take the update's memory).
    assert fake.calls[-2] == ("wake_up", ["kv_cache"])
    assert not await fake.resident()
    with pytest.raises(RuntimeError, match="last weight sync failed"):
        await engine.generate([1, 2, 3], PARAMS)
    await engine.sync_weights(good)
    assert len((await engine.generate([1, 2, 3], PARAMS)).token_ids) >= 1


async def test_the_separate_placement_broadcasts_the_weights_without_sleep_mode(
    model_dir: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    fake = FakeAsyncLLM(str(model_dir), sleep_mode=False)
    try:
        engine = VLLMEngine(
            fake,
            name="vllm0",
            capacity_tokens=8192,
            bucket_bytes=BUCKET_BYTES,
            placement="separate",
            api=API,
        )
        trainer = AutoModelForCausalLM.from_pretrained(model_dir)
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        await engine.release_memory()  # nothing to free: the engine has GPUs of its own
        for _ in range(2):
            await engine.sync_weights(trainer.named_parameters())
        syncs, values, after_load = await fake.loads()
        names = {checkpoint_name(n) for n, _ in trainer.named_parameters()}
        assert len(syncs) == after_load == 2 and all(set(s) == names for s in syncs)
        for name, param in trainer.named_parameters():
            expected = param.detach().bfloat16().contiguous().view(torch.int16).numpy().tobytes()
            assert values[checkpoint_name(name)] == expected, name
        methods = [c[1] for c in fake.calls if c[0] == "collective_rpc"]
        assert methods[0] == "rl_init_weight_group" and methods.count("rl_init_weight_group") == 1
        assert "rl_load_bucket" not in methods and "rl_receive_bucket" in methods
        assert not any(c[0] in ("sleep", "wake_up") for c in fake.calls)
        assert len((await engine.generate([1, 2, 3], PARAMS)).token_ids) >= 1
    finally:
        fake.shutdown()


def sync_calls(calls: list[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
    """The calls of each sync, from the first weight load (or wake) to the prefix-cache reset."""
    out: list[list[tuple[str, Any]]] = []
    current: list[tuple[str, Any]] = []
    for call in calls:
        if call[0] in ("wake_up", "collective_rpc", "reset_prefix_cache"):
            current.append(call)
        if call[0] == "reset_prefix_cache":
            out.append(current)
            current = []
    assert not current, current
    return out


@pytest.mark.timeout(300)  # about 50 s alone on 2 cores, twice that beside other work
async def test_a_sft_and_grpo_run_pushes_every_parameter_once_per_sync_in_order(
    tmp_path: Path, verifier: VerifierPool
) -> None:
    settings = resume_settings(tmp_path)
    settings["stages"] = [
        {"name": "sft", "kind": "sft", "steps": 60, "batch_size": 8, "learning_rate": 1e-2},
        {"name": "rl", "kind": "grpo", "steps": 2, "warmup_steps": 1},
    ]
    settings["trainer"] = {"keep_checkpoints": 1}
    config = config_from_dict(settings)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    client = SandboxClient(NO_SANDBOX)
    with Recorder(run_dir, [], progress=False) as records:
        records.start_fresh()
        topology = Topology(0, 1, 0, torch.device("cpu"))
        ctx = build_context(config, run_dir, client, verifier, records, None, topology)
        ctx.model.save_pretrained(tmp_path / "served")
        ctx.tokenizer.save_pretrained(tmp_path / "served")
        fake = FakeAsyncLLM(str(tmp_path / "served"))
        try:
            engine = vllm_engine(fake)
            ctx.engines = [engine]
            ctx.scheduler = RolloutScheduler(ctx.engines)
            async with client:
                await run_stages(ctx)
            syncs, last_values, after_load = await fake.loads()
        finally:
            fake.shutdown()
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = sum(not line["skipped_update"] for line in lines)
    assert updates >= 1, lines  # else no after-update sync is seen
    expected = syncs_for(["sft", "grpo"], [0, updates])
    assert len(syncs) == len(expected) == engine.syncs == after_load

    names = {checkpoint_name(n): tuple(p.shape) for n, p in ctx.model.named_parameters()}
    for sync in syncs:  # each parameter exactly once, under its checkpoint name, in bf16
        assert {name: count for name, (count, _, _) in sync.items()} == dict.fromkeys(names, 1)
        assert {name: tuple(shape) for name, (_, shape, _) in sync.items()} == names
        assert {dtype for _, _, dtype in sync.values()} == {"torch.bfloat16"}
    for name, param in ctx.model.named_parameters():  # the last push is the trained policy
        mine = param.detach().bfloat16().contiguous().view(torch.int16).numpy().tobytes()
        assert last_values[checkpoint_name(name)] == mine, name

    # Order: asleep for SFT and each update, then wake the weights, load, post-load, wake the
    # KV cache, reset the prefix cache.
    per_sync = sync_calls(fake.calls)
    loads = [("collective_rpc", "rl_load_bucket")] * (len(per_sync[0]) - 4)
    assert len(loads) > 1
    finish = [("collective_rpc", "rl_finish_load")]
    for sync in per_sync:
        assert sync == [
            ("wake_up", ["weights"]),
            *loads,
            *finish,
            ("wake_up", ["kv_cache"]),
            ("reset_prefix_cache", None),
        ]
    sleeps = [i for i, call in enumerate(fake.calls) if call[0] == "sleep"]
    assert len(sleeps) == 1 + updates
    assert all(fake.calls[i + 1] == ("wake_up", ["weights"]) for i in sleeps)
    assert sum(call[0] == "generate" for call in fake.calls) == sum(x["rollouts"] for x in lines)
