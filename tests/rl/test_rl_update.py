"""A GRPO-RoC update moves the policy in the direction of the advantages; SFT fits its data."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from rl_tiny import PRODUCT, SUCCESS, TEMPLATE, examples, tiny_policy

from rl.config import GRPOConfig
from rl.grpo import final_rewards, minibatch_partition, policy_update, select_and_weigh
from rl.logprobs import pad_responses, response_logprobs
from rl.sft import sft_step
from rl.trajectory import ToolRecord, Trajectory


def sequence_logprob(model: Any, t: Trajectory) -> float:
    batch = pad_responses([t.prompt_ids], [t.response_ids], [t.loss_mask], pad_id=0)
    with torch.no_grad():
        return float((response_logprobs(model, batch) * batch.loss_mask).sum())


def two_answers(codec: Any) -> tuple[Trajectory, Trajectory]:
    prompt = codec.encode(TEMPLATE.prompt("What is 123 * 456?"))
    good = codec.encode("It is 56088.</reason><answer>\\boxed{56088}</answer><|im_end|>")
    bad = codec.encode("I know this one.</reason><answer>\\boxed{1}</answer><|im_end|>")
    return (
        Trajectory(prompt, good, [1] * len(good), [0.0] * len(good)),
        Trajectory(prompt, bad, [1] * len(bad), [0.0] * len(bad)),
    )


def test_update_raises_the_positive_and_lowers_the_negative_rollout() -> None:
    tokenizer, model, codec = tiny_policy(seed=1)
    good, bad = two_answers(codec)
    before = sequence_logprob(model, good), sequence_logprob(model, bad)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    metrics = policy_update(
        model, optimizer, [good, bad], [1.0, -1.0], GRPOConfig(), pad_id=tokenizer.pad_token_id
    )
    after = sequence_logprob(model, good), sequence_logprob(model, bad)
    assert after[0] > before[0] and after[1] < before[1]
    assert metrics["grad_norm"] > 0
    assert metrics["clip_frac"] == 0.0  # one update from pi_old: the ratio is exactly 1


def test_swapped_advantages_move_the_other_way() -> None:
    tokenizer, model, codec = tiny_policy(seed=1)
    good, bad = two_answers(codec)
    before = sequence_logprob(model, good)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    policy_update(
        model, optimizer, [good, bad], [-1.0, 1.0], GRPOConfig(), pad_id=tokenizer.pad_token_id
    )
    assert sequence_logprob(model, good) < before


def test_masked_tokens_get_no_gradient_and_zero_advantage_moves_nothing() -> None:
    tokenizer, model, codec = tiny_policy(seed=2)
    good, _ = two_answers(codec)
    masked = Trajectory(
        good.prompt_ids,
        good.response_ids,
        [0] * len(good.response_ids),
        [0.0] * len(good.response_ids),
    )
    one = Trajectory(good.prompt_ids, good.response_ids[:1], [1], [0.0])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    params = [p.detach().clone() for p in model.parameters()]
    # Only `one` has a trained token, and its advantage is 0: no parameter may change.
    policy_update(
        model,
        optimizer,
        [masked, one],
        [5.0, 0.0],
        GRPOConfig(),
        pad_id=tokenizer.pad_token_id,
        recompute_old_logprobs=False,
    )
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters(), strict=True))


def test_selection_keeps_g_per_informative_group_with_zero_mean_advantages() -> None:
    config = GRPOConfig(group_size=4, oversample=2, min_pos=1, min_neg=1)
    trajectories, correct = [], []
    for group, rewards in enumerate([[1, 0, 1, 0, 0, 0, 1, 1], [1] * 8, [0, 0, 0, 1, 0, 0, 0, 0]]):
        for r in rewards:
            calls = [ToolRecord(1, "ok", "Tool call success")]
            trajectories.append(
                Trajectory(
                    [1],
                    [2],
                    [1],
                    [0.0],
                    tool_results=calls,
                    turn_spans=[(0, 1)],
                    finish_reason="answer",
                    response_text="<answer>x</answer>",
                    group=group,
                )
            )
            correct.append(float(r))
    trajectories[0].finish_reason = "max_tokens"  # truncated: scored 0 whatever it says
    rewards = final_rewards(trajectories, correct)
    assert rewards[0] == 0.0
    selection = select_and_weigh(trajectories, rewards, config, random.Random(0))
    assert selection.groups == 3 and selection.dropped_groups == 1  # all-correct group
    assert len(selection.kept) == 8
    assert {trajectories[i].group for i in selection.kept} == {0, 2}
    for group in (0, 2):
        advantages = [
            a
            for i, a in zip(selection.kept, selection.advantages, strict=True)
            if trajectories[i].group == group
        ]
        assert abs(sum(advantages)) < 1e-5 and len(advantages) == 4
    assert selection.kept_pos + selection.kept_neg == 8


def test_sft_steps_fit_the_demonstrations() -> None:
    tokenizer, model, codec = tiny_policy(seed=4)
    data = examples(codec, PRODUCT, SUCCESS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = sft_step(model, optimizer, data, pad_id=tokenizer.pad_token_id, micro_batch_size=3)
    for _ in range(15):
        last = sft_step(model, optimizer, data, pad_id=tokenizer.pad_token_id, micro_batch_size=3)
    assert last["loss"] < first["loss"] / 2


def test_minibatches_hold_whole_groups_not_length_bands() -> None:
    # Group g's rollouts have lengths g, g + 10, g + 20, g + 30: a sort by length would put
    # every group's short rollouts in the first optimizer step and its long ones in the last.
    groups = [g for g in range(8) for _ in range(4)]
    parts = minibatch_partition(groups, 4, random.Random(0))
    assert len(parts) == 4 and sorted(i for p in parts for i in p) == list(range(32))
    for part in parts:
        in_part = {groups[i] for i in part}
        assert len(in_part) == 2 and sorted(part) == [i for i in range(32) if groups[i] in in_part]
    # Shuffled: another seed deals other groups together; no rng keeps first-seen order.
    assert minibatch_partition(groups, 4) == [list(range(k, k + 8)) for k in range(0, 32, 8)]
    shuffled = [minibatch_partition(groups, 4, random.Random(s)) for s in range(5)]
    assert any(p != shuffled[0] for p in shuffled)
    assert minibatch_partition([5, 5, 9], 4) == [[0, 1], [2]]  # fewer groups than mini-batches


def test_the_loss_is_the_mean_over_the_optimizer_steps_taken() -> None:
    # Three groups and minibatches=4: three optimizer steps. With lr 0 the ratio stays 1, so
    # every step's token-mean loss is -A = -1 and so is their mean.
    tokenizer, model, codec = tiny_policy(seed=3)
    good, bad = two_answers(codec)
    rows = [good, bad, good]
    trajectories = [
        Trajectory(t.prompt_ids, t.response_ids, t.loss_mask, t.logprobs, group=g)
        for g, t in enumerate(rows)
    ]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics = policy_update(
        model,
        optimizer,
        trajectories,
        [1.0, 1.0, 1.0],
        GRPOConfig(),
        pad_id=tokenizer.pad_token_id,
        minibatches=4,
    )
    assert metrics["optimizer_steps"] == 3
    assert metrics["loss"] == pytest.approx(-1.0, abs=1e-6)


@pytest.mark.parametrize(
    "status", ["queue_timeout", "sandbox_error", "cancelled", "deadline_exceeded"]
)
def test_rollouts_that_met_an_infrastructure_status_are_kept_out_of_the_loss(status: str) -> None:
    config = GRPOConfig(group_size=2, oversample=2, min_pos=1, min_neg=1)
    trajectories, rewards = [], []
    # Group 0: its one failing rollout met the infrastructure; group 1: every rollout did.
    for group, statuses, group_rewards in (
        (0, ["ok", "ok", status, "ok"], [1.0, 0.0, 0.0, 1.0]),
        (1, [status] * 4, [1.0, 0.0, 1.0, 0.0]),
    ):
        for call_status, reward in zip(statuses, group_rewards, strict=True):
            trajectories.append(
                Trajectory(
                    [1],
                    [2],
                    [1],
                    [0.0],
                    tool_results=[ToolRecord(1, call_status, "")],
                    turn_spans=[(0, 1)],
                    finish_reason="answer",
                    response_text="<answer>x</answer>",
                    group=group,
                )
            )
            rewards.append(reward)
    selection = select_and_weigh(trajectories, rewards, config, random.Random(0))
    assert selection.infra_masked == 5
    assert 2 not in selection.kept and not {4, 5, 6, 7} & set(selection.kept)
    assert selection.groups == 2 and selection.dropped_groups == 1
    assert len(selection.kept) == 2 and 1 in selection.kept  # its one clean negative
