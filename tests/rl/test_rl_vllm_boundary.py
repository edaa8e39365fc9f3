"""The contract at vLLM's process boundary: what the weight sync hands to `collective_rpc`
encodes with vLLM's strict msgpack rule (no hook: no functions, classes or dtypes) and works as
vLLM's decoder hands it to the worker (tuples as lists, bytes as bytes)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fake_vllm import _RecordingModel, vllm_decode, vllm_encode

from rl.engines.vllm_colocated import VLLMEngine
from rl.engines.vllm_cuda import VLLMWorkerExtension, bucketed


class InProcessWorker(VLLMWorkerExtension):
    def __init__(self, module: torch.nn.Module) -> None:
        self.device = torch.device("cpu")
        self.model_config = None
        self.model_runner = type("Runner", (), {"model": _RecordingModel(module)})()
        self.finished = 0

    def _process_weights_after_loading(self) -> None:
        self.finished += 1
        self.model_runner.model.finish()


class BoundaryEngine:
    """Every call encoded and decoded as vLLM's engine core client does, then run in-process."""

    def __init__(self, worker: InProcessWorker) -> None:
        self.worker = worker
        self.wire: list[list[Any]] = []

    async def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,  # noqa: ASYNC109 (vLLM's signature)
        args: Any = (),
        kwargs: Any = None,
    ) -> list[Any]:
        message = vllm_decode(vllm_encode([method, args, kwargs or {}]))
        self.wire.append(message)
        name, wire_args, wire_kwargs = message
        return [getattr(self.worker, name)(*wire_args, **wire_kwargs)]

    async def sleep(self, level: int = 1) -> None:
        vllm_encode([level])

    async def wake_up(self, tags: list[str] | None = None) -> None:
        vllm_encode([tags])

    async def reset_prefix_cache(self) -> bool:
        return True


def two_layers() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))


async def test_a_sync_hands_collective_rpc_plain_data_that_loads_every_weight() -> None:
    trainer = two_layers()
    served = two_layers()
    with torch.no_grad():
        for p in served.parameters():
            p.zero_()
    worker = InProcessWorker(served)
    boundary = BoundaryEngine(worker)
    engine = VLLMEngine(boundary, name="v", capacity_tokens=64, bucket_bytes=64)
    await engine.release_memory()
    await engine.sync_weights(trainer.named_parameters())
    methods = [m for m, _, _ in boundary.wire]
    assert methods[-1] == "rl_finish_load" and set(methods[:-1]) == {"rl_load_bucket"}
    assert len(methods) - 1 == len(
        list(bucketed(trainer.named_parameters(), 64, dtype=torch.bfloat16))
    )
    for _, args, _ in boundary.wire[:-1]:
        handle, layout = args
        assert isinstance(handle, bytes)
        assert all(isinstance(slot, list) and isinstance(slot[1], list) for slot in layout)
    (sync,) = worker.model_runner.model.syncs
    assert {name: count for name, (count, _, _) in sync.items()} == dict.fromkeys(
        dict(trainer.named_parameters()), 1
    )
    assert all(dtype == "torch.bfloat16" for _, _, dtype in sync.values())
    for name, param in trainer.named_parameters():
        assert torch.equal(dict(served.named_parameters())[name], param.bfloat16().float())
    assert worker.finished == 1


def test_the_strict_rule_refuses_what_pickle_would_carry() -> None:
    # What the sync passed before: torch's reduction tuple (a function, a class, a dtype).
    from torch.multiprocessing.reductions import reduce_tensor

    with pytest.raises(TypeError):
        vllm_encode([reduce_tensor(torch.zeros(2))])
    assert vllm_decode(vllm_encode([("a", (1, 2))])) == [["a", [1, 2]]]
