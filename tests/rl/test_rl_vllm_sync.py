"""The pure parts of the vLLM weight sync (names, bf16 buckets, when the engines are synced,
where an engine runs, what is refused) and the start-up check of the torch and vLLM APIs."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

from rl.engines.vllm_sync import (
    buckets,
    check_allocator_config,
    check_logprob_match,
    check_placement,
    checkpoint_name,
    engine_environment,
    engine_visible_devices,
    separate_environment,
    syncs_for,
)
from rl.parallel.distributed import collective_device, collective_device_for
from rl.run.collect import samples_from_policy
from rl.versions import check_torch, check_vllm, missing


@pytest.mark.parametrize(
    ("trainer", "checkpoint"),
    [
        ("lm.model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("_orig_mod.lm.lm_head.weight", "lm_head.weight"),
        ("module.model.embed_tokens.weight", "model.embed_tokens.weight"),
        (
            "model.layers._fsdp_wrapped_module.3.mlp.up_proj.weight",
            "model.layers.3.mlp.up_proj.weight",
        ),
        ("model.norm.weight", "model.norm.weight"),
    ],
)
def test_wrapper_prefixes_are_removed(trainer: str, checkpoint: str) -> None:
    assert checkpoint_name(trainer) == checkpoint


def test_buckets_keep_order_fit_the_budget_and_lay_tensors_end_to_end() -> None:
    params = [("a", (4, 4)), ("b", (8,)), ("c", (100,)), ("d", (2, 3)), ("e", (1,))]
    out = buckets(params, bucket_bytes=64)  # 32 bf16 elements
    assert [[s.name for s in b.slots] for b in out] == [["a", "b"], ["c"], ["d", "e"]]
    for bucket in out:
        offset = 0
        for slot in bucket.slots:
            assert slot.offset == offset
            offset += slot.numel
        assert offset == bucket.numel
        assert len(bucket.slots) == 1 or bucket.numel * 2 <= 64
    assert [s.name for b in out for s in b.slots] == [n for n, _ in params]


def test_engines_are_synced_after_sft_and_each_update_never_twice_in_a_row() -> None:
    # The stage-start sync finds the engines holding the policy's weights each time (the run's
    # starting weights, or those of the SFT stage's or the last update's sync): it is skipped.
    assert syncs_for(["sft", "grpo", "grpo"], [0, 2, 1]) == [
        "after_sft",
        "after_update",
        "after_update",
        "after_update",
    ]
    assert syncs_for(["grpo", "sft", "sft", "grpo"], [1, 0, 0, 0]) == [
        "after_update",
        "after_sft",
        "after_sft",
    ]


def test_each_ranks_engine_runs_on_that_ranks_device() -> None:
    assert engine_visible_devices(None, 3, 8, 1) == "3"
    assert engine_visible_devices("4,5,6,7", 2, 4, 1) == "6"
    assert engine_visible_devices(None, 0, 1, 2) == "0,1"
    assert engine_visible_devices("2,3,5", 0, 1, 2) == "2,3"
    with pytest.raises(ValueError, match="tensor_parallel_size must be 1"):
        engine_visible_devices(None, 0, 2, 2)
    with pytest.raises(ValueError, match="visible devices"):
        engine_visible_devices("0", 0, 1, 2)


def test_a_launcher_that_binds_one_gpu_per_process_places_the_engine_on_it() -> None:
    # Local rank 3 seeing only its own GPU trains on device 0 (local_rank % device_count()).
    assert engine_visible_devices("3", 3, 8, 1) == "3"
    assert engine_visible_devices("6,7", 3, 8, 1) == "7"


def test_the_engines_environment_narrows_hip_with_cuda_and_keeps_ranks_caches_apart() -> None:
    one = engine_environment({}, local_rank=0, world_size=1, rank=0, tensor_parallel_size=1)
    assert one == {"CUDA_VISIBLE_DEVICES": "0"}  # one process: vLLM's own cache
    amd = {"HIP_VISIBLE_DEVICES": "4,5,6,7", "VLLM_CACHE_ROOT": "/cache/vllm"}
    rank6 = engine_environment(amd, local_rank=2, world_size=16, rank=6, tensor_parallel_size=1)
    assert rank6 == {
        "CUDA_VISIBLE_DEVICES": "6",
        "HIP_VISIBLE_DEVICES": "6",  # vLLM's ROCm platform asserts both are equal
        "VLLM_CACHE_ROOT": "/cache/vllm/rank6",
    }
    both = {"HIP_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert (
        engine_environment(both, local_rank=1, world_size=2, rank=1, tensor_parallel_size=1)[
            "HIP_VISIBLE_DEVICES"
        ]
        == "3"
    )  # HIP's runtime reads HIP_VISIBLE_DEVICES before CUDA_VISIBLE_DEVICES
    caches = {
        engine_environment({}, local_rank=r, world_size=8, rank=r, tensor_parallel_size=1)[
            "VLLM_CACHE_ROOT"
        ]
        for r in range(8)
    }
    assert len(caches) == 8


def placement(kind: str, sleep_mode: bool, **kwargs: Any) -> None:
    given: dict[str, Any] = {"world_size": 1, "engine_devices": "", "tensor_parallel_size": 1}
    check_placement(kind, vllm_version="0.11.0", sleep_mode=sleep_mode, **(given | kwargs))


def test_each_placement_is_accepted_or_refused_as_docs_rl_md_says() -> None:
    placement("colocated", True)  # CUDA, or ROCm with a vLLM whose platform has sleep mode
    with pytest.raises(ValueError, match=r"vLLM 0\.11\.0 has no sleep mode.*separate"):
        placement("colocated", False)  # vLLM 0.11.0 on ROCm
    placement("separate", False, engine_devices="1")  # no sleep mode needed
    placement("separate", True, engine_devices="1,2", tensor_parallel_size=2)
    with pytest.raises(ValueError, match="under torchrun"):
        placement("separate", False, engine_devices="1", world_size=2)
    with pytest.raises(ValueError, match="naming the engine's 2 GPU"):
        placement("separate", False, engine_devices="1", tensor_parallel_size=2)
    with pytest.raises(ValueError, match='separate" only'):
        placement("colocated", True, engine_devices="1")
    with pytest.raises(ValueError, match="expected"):
        placement("remote", True)


def test_a_separate_engine_gets_its_own_gpus_never_the_trainers() -> None:
    assert separate_environment({}, "1,2") == {"CUDA_VISIBLE_DEVICES": "1,2"}
    amd = {"HIP_VISIBLE_DEVICES": "4,5,6,7"}
    assert separate_environment(amd, "3") == {
        "CUDA_VISIBLE_DEVICES": "7",
        "HIP_VISIBLE_DEVICES": "7",
    }
    with pytest.raises(ValueError, match="device 0"):
        separate_environment({}, "0")
    with pytest.raises(ValueError, match="only 4 devices"):
        separate_environment(amd, "4")


@pytest.mark.parametrize(
    ("conf", "refused"),
    [
        (None, False),
        ("max_split_size_mb:128", False),
        ("expandable_segments:False", False),
        ("expandable_segments:True", True),
        ("max_split_size_mb:64, expandable_segments:true", True),
    ],
)
@pytest.mark.parametrize(
    "variable", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF"]
)
def test_expandable_segments_are_refused_with_vllm_sleep_mode(
    conf: str | None, refused: bool, variable: str
) -> None:
    environ = {} if conf is None else {variable: conf}
    if refused:
        with pytest.raises(ValueError, match=f"{variable} has expandable_segments"):
            check_allocator_config(environ)
    else:
        check_allocator_config(environ)


def test_top_p_below_one_is_refused_for_vllm_logprobs() -> None:
    check_logprob_match(1.0)
    with pytest.raises(ValueError, match="top_p"):
        check_logprob_match(0.95)


def test_the_start_up_check_names_what_is_missing() -> None:
    check_torch()  # this torch has everything rl/parallel calls
    fake_torch = {"torch.accelerator": types.SimpleNamespace(current_accelerator=None)}

    def importer(name: str) -> object:
        if name in fake_torch:
            return fake_torch[name]
        raise ImportError(name)

    with pytest.raises(RuntimeError, match=r"torch.accelerator.device_count.*torch >= 2.8"):
        check_torch(importer)
    with pytest.raises(RuntimeError, match="vllm is not installed"):
        check_vllm(importer)
    vllm = types.SimpleNamespace(AsyncEngineArgs=None, SamplingParams=object)
    with pytest.raises(RuntimeError, match=r"vllm.AsyncLLMEngine, .*vLLM 0.11.0"):
        check_vllm(lambda name: vllm if name == "vllm" else importer(name))
    assert missing((("vllm", "SamplingParams"),), lambda name: vllm) == []


def test_collectives_take_the_groups_device() -> None:
    cuda1 = torch.device("cuda", 1)
    assert collective_device_for("nccl", cuda1) == cuda1
    assert collective_device_for("gloo", cuda1) == torch.device("cpu")
    assert collective_device() == torch.device("cpu")  # no group


def test_only_an_engine_sharing_the_policy_needs_it_gathered() -> None:
    from rl_tiny import tiny_policy

    from rl.engines.hf import TransformersEngine

    tokenizer, model, _ = tiny_policy()
    assert samples_from_policy([TransformersEngine(model, tokenizer)])
    assert not samples_from_policy([object()])  # vLLM, a remote server: their own weights
