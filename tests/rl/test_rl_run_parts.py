"""The trainer's pure parts: draw order, checkpoint pruning, the difficulty filter, schedules,
metric sinks, pass@1."""

from __future__ import annotations

import itertools
import random
import struct
from pathlib import Path

import pytest

from rl.data.order import DrawOrder
from rl.run.checkpoint import stale_checkpoints, step_tag
from rl.run.evaluate import pass_at_1
from rl.run.optim import sft_rate_factor, warmup_constant, warmup_cosine, warmup_stable_decay
from rl.run.records import Recorder, TensorBoardSink, flat_scalars
from rl.run.stages import after_filter, problems_to_check
from rl.run.trainer import run_summary_lines


def test_draw_order_is_epochs_of_shuffles_and_resumes_from_its_position() -> None:
    order = DrawOrder(10, seed=3, stream="grpo")
    first = order.take(7) + order.take(7)  # crosses into the second epoch
    assert sorted(first[:10]) == list(range(10)) and order.position() == {"epoch": 1, "index": 4}
    later = order.take(9)
    resumed = DrawOrder(10, seed=3, stream="grpo", epoch=1, index=4)
    assert resumed.take(9) == later
    assert DrawOrder(10, seed=3, stream="sft").take(10) != first[:10]  # streams differ
    with pytest.raises(ValueError):
        DrawOrder(0, seed=0, stream="x")


def test_pruning_keeps_the_newest_periodic_checkpoints_and_every_stage_end() -> None:
    tags = ["sft-end", step_tag(3), step_tag(10), "stage1-end", step_tag(20), "tmp"]
    assert stale_checkpoints(tags, keep=1) == ["step-00003", "step-00010"]
    assert stale_checkpoints(tags, keep=2) == ["step-00003"]
    assert stale_checkpoints(tags, keep=0) == ["step-00003", "step-00010", "step-00020"]
    assert stale_checkpoints(["sft-end", "rl-end"], keep=0) == []


def test_the_filter_samples_at_random_and_keeps_what_it_did_not_check() -> None:
    # The old filter checked problems[:cap] and trained on those alone.
    checked = problems_to_check(100, 10, random.Random(0))
    assert len(checked) == 10 and checked != list(range(10)) and checked == sorted(checked)
    assert problems_to_check(5, 0, random.Random(0)) == [0, 1, 2, 3, 4]
    assert problems_to_check(5, 9, random.Random(0)) == [0, 1, 2, 3, 4]
    kept = after_filter(100, checked, [True] * 5 + [False] * 5)
    assert len(kept) == 95 and not set(checked[:5]) & set(kept) and set(checked[5:]) <= set(kept)


def test_schedules() -> None:
    assert [warmup_constant(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_constant(0, 0) == 1.0
    assert warmup_cosine(0, 2, 10) == 0.5 and warmup_cosine(2, 2, 10) == 1.0
    assert warmup_cosine(10, 2, 10) == pytest.approx(0.0)


def test_the_constant_sft_schedule_holds_the_rate_until_its_decay_steps() -> None:
    # warm-up 2, total 10, the last 4 decaying: steps 1..6 at the full rate, then down to 0.
    factors = [warmup_stable_decay(s, 2, 10, 4) for s in range(11)]
    assert factors[:7] == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert factors[8] == pytest.approx(0.5) and factors[10] == pytest.approx(0.0)
    assert all(a > b for a, b in itertools.pairwise(factors[6:]))
    assert [warmup_stable_decay(s, 2, 10, 0) for s in (2, 9, 10)] == [1.0, 1.0, 1.0]
    constant = sft_rate_factor("constant", 2, 10, 4)
    assert [constant(s) for s in range(11)] == factors
    assert sft_rate_factor("cosine", 2, 10, 0)(6) == warmup_cosine(6, 2, 10) < 1.0
    with pytest.raises(ValueError, match="unknown SFT learning-rate schedule"):
        sft_rate_factor("linear", 2, 10, 0)


def test_the_end_of_run_summary_reads_rl_rewards_and_allows_a_run_of_sft_alone(
    tmp_path: Path,
) -> None:
    (tmp_path / "summary.json").write_text('{"duration_s": 12.4, "global_steps": 0}')
    # A run of SFT stages alone writes no metrics.jsonl; the summary used to crash on it.
    assert run_summary_lines(tmp_path)[1] == "no RL steps; duration 12 s"
    rewards = [0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 0.9]
    lines = "".join(f'{{"reward_mean": {r}}}\n' for r in rewards)
    (tmp_path / "metrics.jsonl").write_text(lines)
    assert run_summary_lines(tmp_path) == [
        f"run directory: {tmp_path}",
        "RL steps: 10; reward_mean first 3 steps 0.200, last fifth (2 steps) 0.950; duration 12 s",
    ]


def test_pass_at_1_is_the_mean_of_per_problem_success_rates() -> None:
    assert pass_at_1([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]) == pytest.approx(0.625)
    with pytest.raises(ValueError):
        pass_at_1([[1.0], []])


def test_flat_scalars_keep_numbers_and_flatten_nesting() -> None:
    line = {
        "step": 3,
        "reward_mean": 0.5,
        "skipped_update": False,
        "stage": "grpo",
        "engines": {"e0": {"rollouts": 8}},
        "finish": {"answer": 2},
    }
    assert flat_scalars(line, "rl/") == {
        "rl/step": 3.0,
        "rl/reward_mean": 0.5,
        "rl/skipped_update": 0.0,
        "rl/engines/e0/rollouts": 8.0,
        "rl/finish/answer": 2.0,
    }


def tfrecords(data: bytes) -> list[bytes]:
    """The records of a TFRecord file: length (u64), its crc (u32), data, the data's crc (u32)."""
    out, at = [], 0
    while at < len(data):
        (length,) = struct.unpack("<Q", data[at : at + 8])
        out.append(data[at + 12 : at + 12 + length])
        at += 12 + length + 4
    return out


def test_tensorboard_sink_writes_event_files_that_read_back(tmp_path: Path) -> None:
    pytest.importorskip("tensorboardX")
    from tensorboardX.proto.event_pb2 import Event

    with Recorder(tmp_path, [TensorBoardSink(tmp_path / "tb")], progress=False) as records:
        records.start_fresh()
        for step in (1, 2):
            records.rl_step({"step": step, "stage": "grpo", "reward_mean": step / 4})
    (event_file,) = (tmp_path / "tb").iterdir()
    seen = []
    for record in tfrecords(event_file.read_bytes()):
        event = Event.FromString(record)
        for value in event.summary.value:
            seen.append((event.step, value.tag, round(value.simple_value, 4)))
    assert (1, "rl/reward_mean", 0.25) in seen and (2, "rl/reward_mean", 0.5) in seen
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 2


def test_wandb_sink_writes_an_offline_run(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    from rl.run.records import WandbSink

    sink = WandbSink(tmp_path, project="rl-sandbox-test", name="t", config={"seed": 0})
    sink.scalars(1, {"rl/reward_mean": 0.25})
    sink.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(p.suffix == ".wandb" for p in runs[0].iterdir())
