"""FSDP2 on 2 CPU processes (gloo, under torchrun) gives the loss, gradients and update of 1
process on the same batch."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl.engines.vllm_sync import checkpoint_name
from rl.logprobs import LogProbModel, pad_responses, response_logprobs
from rl.parallel.microbatch import pad_plan, split_balanced, token_budget_batches

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("fsdp_worker.py")


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]


def descendants(pid: int) -> list[int]:
    """Every process below pid (torchrun starts its workers in sessions of their own, so its
    process group alone does not reach them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the launcher and everything it started (workers stuck in a collective would
    otherwise outlive the test)."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def run_tree(args: list[str], cwd: Path, timeout_s: float = 240) -> None:
    """Run args to completion; on a failure or timeout, kill its whole tree and say why."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    log = cwd / f"run-{len(list(cwd.glob('run-*.log')))}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            args, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = proc.wait(timeout=timeout_s)
        except BaseException:
            kill_tree(proc)
            raise
        finally:
            if proc.poll() is None:
                kill_tree(proc)
    if code != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise AssertionError(f"{args[-3:]} exited {code}:\n{tail}")


GLOO_ABORT = "terminate called without an active exception"
"""What torch 2.15's gloo printed once in CI when a rank aborted (exit -6) with no Python error."""


def _run(args: list[str], tmp_path: Path) -> None:
    try:
        run_tree(args, tmp_path)
    except AssertionError as exc:
        if GLOO_ABORT not in str(exc):
            raise
        run_tree(args, tmp_path)  # once more: a crash of the runtime, not a wrong result


@pytest.mark.slow
@pytest.mark.timeout(540)
def test_two_gloo_ranks_give_the_loss_and_gradients_of_one_process(tmp_path: Path) -> None:
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    _run([sys.executable, str(WORKER), "grads", str(one)], tmp_path)
    _run([*TORCHRUN, "2", str(WORKER), "grads", str(two), "--fsdp"], tmp_path)
    single, sharded = torch.load(one), torch.load(two)
    assert (single["world"], sharded["world"]) == (1, 2)
    assert abs(single["loss"] - sharded["loss"]) < 1e-6
    assert single["rows"] == sharded["rows"] == 8  # each row once, padding passes not counted
    assert set(single["grads"]) == set(sharded["grads"]) and single["grads"]
    for name, grad in single["grads"].items():
        assert torch.allclose(grad, sharded["grads"][name], atol=1e-6, rtol=1e-4), name
    assert any(float(g.abs().sum()) > 0 for g in single["grads"].values())


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_bucket_of_uneven_shards_is_cast_then_gathered_whole_by_one_all_gather(
    tmp_path: Path,
) -> None:
    out = tmp_path / "uneven.pt"
    _run([*TORCHRUN, "3", str(WORKER), "uneven", str(out)], tmp_path)
    result = torch.load(out)
    assert result["world"] == 3 and result["locals"][:2] == [2, 1]  # torch.chunk's split
    assert result["equal"] and result["dtype"] == "torch.bfloat16"
    assert [dtype for dtype, _ in result["gathers"]] == ["torch.bfloat16"]  # one, cast first


@pytest.mark.slow
@pytest.mark.timeout(540)
def test_the_trainers_sft_and_grpo_update_on_two_gloo_ranks_equal_one_process(
    tmp_path: Path,
) -> None:
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    _run([sys.executable, str(WORKER), "update", str(one)], tmp_path)
    _run([*TORCHRUN, "2", str(WORKER), "update", str(two)], tmp_path)
    single, sharded = torch.load(one), torch.load(two)
    assert (single["world"], sharded["world"]) == (1, 2)
    for part in ("sft", "metrics"):
        assert single[part].keys() == sharded[part].keys(), part
        for key, value in single[part].items():
            assert sharded[part][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (part, key)
    assert single["metrics"]["optimizer_steps"] == 2
    assert single["metrics"]["loss"] != 0.0
    assert single["params"].keys() == sharded["params"].keys()
    moved = 0
    initial = LogProbModel(_tiny()).state_dict()
    for name, param in single["params"].items():
        other, start = sharded["params"][name], initial[name]
        # AdamW divides by the root of the second moment: an element whose gradient is near
        # zero turns float noise of the reduction order into a visible step, so a few elements
        # may differ by more than 1e-5; never by more than a hundredth of how far the tensor
        # moved, and almost all agree to 1e-5: at most one element in a thousand, or one in a
        # small tensor (a bias of 32 elements had one).
        close = torch.isclose(param, other, atol=1e-5, rtol=1e-4)
        differing = int((~close).sum())
        assert differing <= max(1, close.numel() // 1000), (name, differing, close.numel())
        distance = float((param - start).abs().max())
        assert float((param - other).abs().max()) <= 0.01 * distance, (name, distance)
        moved += not torch.equal(param, start)
    # Every parameter took the steps (an untouched one would prove nothing about its shards).
    assert moved == len(single["params"])
    # The checkpoint's whole state dict: the LM's own names, from one process or two.
    assert single["state_keys"] == sharded["state_keys"] == sorted(_tiny().state_dict())
    # The vLLM weight push after the update: every parameter, under its checkpoint name, equal
    # in bf16 to the parameters, and so to the one process's; gathered one bucket at a time.
    for result in (single, sharded):
        params = {checkpoint_name(n): p for n, p in result["params"].items()}
        assert result["pushed"].keys() == params.keys()
        for name, value in result["pushed"].items():
            assert value.dtype == torch.bfloat16
            assert torch.equal(value, params[name].bfloat16()), name
    for name, value in single["pushed"].items():
        assert torch.allclose(sharded["pushed"][name].float(), value.float(), atol=1e-2), name
    assert len(sharded["bucket_slots"]) > 2
    # One all_gather per bucket, of bf16 shards (cast before the gather, not after), and no
    # earlier bucket alive while the next one is gathered: one bucket at a time.
    assert sharded["gathers_per_bucket"] == [1] * len(sharded["bucket_slots"])
    assert {dtype for dtype, _ in sharded["gathered"]} == {"torch.bfloat16"}
    assert [alive for _, alive in sharded["gathered"]] == [0] * len(sharded["bucket_slots"])
    # Every tensor the 2-rank run handed to a collective was on the group's device.
    assert sharded["collective_devices"] == [sharded["group_device"]] == ["cpu"]


@pytest.mark.timeout(120)
def test_a_failed_torchrun_leaves_no_worker_behind(tmp_path: Path) -> None:
    # Both ranks hang (as in a collective that never completes) past the harness's timeout:
    # it must kill them, not only the launcher (the workers run in sessions of their own).
    script = tmp_path / "stuck.py"
    script.write_text(
        "import os, time\n"
        "print(os.getpid(), flush=True)\n"
        "open(f'pid-{os.environ[\"RANK\"]}', 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        run_tree([*TORCHRUN, "2", str(script)], tmp_path, timeout_s=20)
    pids = [int((tmp_path / f"pid-{r}").read_text()) for r in (0, 1)]
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid), pid


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _tiny() -> torch.nn.Module:
    from rl.run.tiny import build_model

    return build_model(
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
