"""The pure parts of the vLLM weight sync: names, bf16 buckets, when the engines are synced."""

from __future__ import annotations

import pytest

from rl.engines.vllm_sync import buckets, checkpoint_name, syncs_for


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
