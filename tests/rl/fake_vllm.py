"""A test double of vLLM's AsyncLLM and its GPU worker, for CPU tests of VLLMEngine.

vLLM cannot be installed here; this double keeps the semantics the trainer depends on:
- the worker runs in its own process (vLLM V1's engine core always does);
- every call crosses a msgpack boundary with vLLM's rule: a strict encoder with no hook for
  other objects (functions, classes, dtypes, tensors of the trainer raise TypeError), decoded
  as vLLM decodes (tuples arrive as lists, bytes as bytes);
- sleep(level) puts both tags ("weights", "kv_cache") to sleep; wake_up(tags) wakes those given
  (all without tags); generate is refused unless both are awake, a weight load unless the
  weights are; with vLLM's executor rule (vllm/v1/executor/abstract.py, 0.11.0 and later): a
  sleep while any tag still sleeps does nothing (the weights stay where they are), and so does a
  wake_up naming a tag that is awake;
- started with sleep_mode=False (vLLM's enable_sleep_mode=False, the separate placement), sleep
  and wake_up raise; the weights then come by broadcast: the real WeightReceiver methods
  (rl_init_weight_group, rl_receive_bucket) join a gloo group with the trainer's process;
- `resident()` says whether the weights hold GPU memory (awake), as a test's stand-in for
  vLLM's memory report;
- the worker is VLLMWorkerExtension itself (rl.engines.vllm_cuda): the real rl_load_bucket
  opens the trainer's buffer with torch's CPU IPC (shared memory) where a GPU uses CUDA IPC; only
  vLLM's own post-load step is replaced by a count;
- generation samples with the worker's own copy of the model (loaded from the model directory,
  then from the pushed weights), so rollouts come from what was pushed.

The parent records every call in `calls`; `loads()` returns, per completed sync, the names,
shapes and dtypes that arrived, and the last sync's values.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import msgpack
import torch

from rl.engines.vllm_cuda import VLLMWorkerExtension

TAGS = ("weights", "kv_cache")


def vllm_encode(obj: Any) -> bytes:
    """vLLM's rule for what crosses into the engine core: plain data only (no default hook)."""
    return msgpack.packb(obj, use_bin_type=True)  # type: ignore[no-any-return]


def vllm_decode(data: bytes) -> Any:
    """As vLLM's decoder gives it back: arrays as lists, bytes as bytes, str as str."""
    return msgpack.unpackb(data, raw=False, use_list=True)


class _RecordingModel:
    """vLLM's model as load_weights sees it: a named weight is copied into the parameter of
    that checkpoint name (an unknown name raises, as vLLM's loaders do)."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm
        self.params = dict(lm.named_parameters())
        self.current: dict[str, list[Any]] = {}
        self.syncs: list[dict[str, list[Any]]] = []
        self.last_values: dict[str, bytes] = {}

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in weights:
            if name not in self.params:
                raise KeyError(f"no parameter {name}")
            record = self.current.setdefault(name, [0, list(tensor.shape), str(tensor.dtype)])
            record[0] += 1
            self.last_values[name] = tensor.contiguous().view(torch.int16).numpy().tobytes()
            with torch.no_grad():
                self.params[name].copy_(tensor.view(self.params[name].shape))

    def finish(self) -> None:
        """The end of a sync (vLLM's post-load step): what arrived becomes one sync's record."""
        self.syncs.append(self.current)
        self.current = {}


class FakeWorker(VLLMWorkerExtension):
    """The worker side: VLLMWorkerExtension over a transformers model on the CPU."""

    def __init__(self, model_path: str, sleep_mode: bool = True) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rl.run.build import load_tokenizer

        torch.set_num_threads(1)
        self.device = torch.device("cpu")
        self.model_config = None
        lm = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.tokenizer = load_tokenizer(model_path, AutoTokenizer)
        self.model_runner = SimpleNamespace(model=_RecordingModel(lm))
        self.awake = dict.fromkeys(TAGS, True)
        self.sleeping = False  # vLLM's Executor.is_sleeping: true until every tag is awake
        self.sleep_mode = sleep_mode  # enable_sleep_mode: without it vLLM cannot free memory
        self.after_load = 0

    def _process_weights_after_loading(self) -> None:
        self.after_load += 1
        self.model_runner.model.finish()

    def call(self, op: str, payload: Any) -> Any:
        if op in ("sleep", "wake_up") and not self.sleep_mode:
            raise RuntimeError("sleep mode is not enabled (enable_sleep_mode=False)")
        if op == "sleep":
            if self.sleeping:  # vLLM: "Executor is already sleeping.", nothing freed
                return None
            self.awake = dict.fromkeys(TAGS, False)
            self.sleeping = True
            return None
        if op == "wake_up":
            if not self.sleeping or any(self.awake[tag] for tag in payload or ()):
                return None  # vLLM: "Executor is not sleeping." / "Tag ... is not in sleeping tags"
            for tag in payload or TAGS:
                self.awake[tag] = True
            self.sleeping = not all(self.awake.values())
            return None
        if op == "resident":
            return self.awake["weights"]
        if op == "reset_prefix_cache":
            return True
        if op == "rpc":
            method, args, kwargs = payload
            if method.startswith("rl_load") and not self.awake["weights"]:
                raise RuntimeError("weights are asleep: their memory is not mapped")
            return getattr(self, method)(*args, **kwargs)
        if op == "generate":
            if not all(self.awake.values()):
                raise RuntimeError(f"generate while asleep: {self.awake}")
            return self._generate(*payload)
        if op == "loads":
            model: _RecordingModel = self.model_runner.model
            return [model.syncs, model.last_values, self.after_load]
        raise ValueError(op)

    def _generate(self, prompt: list[int], sampling: dict[str, Any]) -> list[Any]:
        from rl.engines.base import SamplingParams
        from rl.engines.hf import TransformersEngine

        if not hasattr(self, "engine"):
            self.engine = TransformersEngine(
                self.model_runner.model.lm, self.tokenizer, name="fake", seed=1
            )
        params = SamplingParams(
            max_new_tokens=sampling["max_tokens"],
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            stop=tuple(sampling["stop"]),
            stop_token_ids=tuple(sampling["stop_token_ids"]),
        )
        out = asyncio.run(self.engine.generate(prompt, params))
        stop = out.stop if out.stop != self.tokenizer.eos_token_id else None
        return [out.token_ids, out.logprobs, out.finish_reason, stop, out.text]


def _serve(conn: Any, model_path: str, sleep_mode: bool) -> None:
    worker = FakeWorker(model_path, sleep_mode)
    conn.send_bytes(vllm_encode(["ready", None]))
    while True:
        op, payload = vllm_decode(conn.recv_bytes())
        if op == "shutdown":
            return
        try:
            reply = ["ok", worker.call(op, payload)]
        except Exception as exc:
            reply = ["error", f"{type(exc).__name__}: {exc}"]
        conn.send_bytes(vllm_encode(reply))


class EngineDeadError(RuntimeError):
    """What the engine core raised, as vLLM re-raises it in the caller."""


class FakeAsyncLLM:
    """The calls VLLMEngine makes of vllm's AsyncLLM, each crossing the boundary to the worker."""

    def __init__(self, model_path: str, *, sleep_mode: bool = True) -> None:
        context = multiprocessing.get_context("spawn")  # vLLM's engine core is spawned too
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, model_path, sleep_mode), daemon=True
        )
        self._process.start()
        child.close()
        self._lock = threading.Lock()
        self.calls: list[tuple[str, Any]] = []
        assert vllm_decode(self._conn.recv_bytes())[0] == "ready"

    def _call_sync(self, op: str, payload: Any) -> Any:
        message = vllm_encode([op, payload])  # raises in the caller, as vLLM's encoder does
        with self._lock:
            self._conn.send_bytes(message)
            status, result = vllm_decode(self._conn.recv_bytes())
        if status != "ok":
            raise EngineDeadError(result)
        return result

    async def _call(self, op: str, payload: Any) -> Any:
        return await asyncio.to_thread(self._call_sync, op, payload)

    async def sleep(self, level: int = 1) -> None:
        self.calls.append(("sleep", level))
        await self._call("sleep", level)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))
        await self._call("wake_up", tags)

    async def reset_prefix_cache(self) -> bool:
        self.calls.append(("reset_prefix_cache", None))
        return bool(await self._call("reset_prefix_cache", None))

    async def collective_rpc(
        self,
        method: str,
        timeout: float | None = None,  # noqa: ASYNC109 (vLLM's signature)
        args: Any = (),
        kwargs: Any = None,
    ) -> list[Any]:
        self.calls.append(("collective_rpc", method))
        return [await self._call("rpc", [method, args, kwargs or {}])]  # one worker

    async def generate(
        self, prompt: dict[str, Any], sampling_params: dict[str, Any], request_id: str
    ) -> AsyncIterator[Any]:
        self.calls.append(("generate", request_id))
        tokens, logprobs, finish, stop, text = await self._call(
            "generate", [prompt["prompt_token_ids"], sampling_params]
        )
        steps = None
        if logprobs is not None:
            steps = [
                {t: SimpleNamespace(logprob=lp)} for t, lp in zip(tokens, logprobs, strict=True)
            ]
        completion = SimpleNamespace(
            token_ids=tokens, logprobs=steps, finish_reason=finish, stop_reason=stop, text=text
        )
        yield SimpleNamespace(outputs=[completion])

    async def resident(self) -> bool:
        """Whether the engine's weights hold memory (awake)."""
        return bool(await self._call("resident", None))

    async def loads(self) -> tuple[list[dict[str, list[Any]]], dict[str, bytes], int]:
        syncs, values, after_load = await self._call("loads", None)
        return syncs, values, after_load

    def shutdown(self) -> None:
        if self._process.is_alive():
            with self._lock:
                self._conn.send_bytes(vllm_encode(["shutdown", None]))
            self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


API = SimpleNamespace(
    SamplingParams=lambda **kwargs: dict(kwargs),
    inputs=SimpleNamespace(
        TokensPrompt=lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    ),
)
"""vllm.SamplingParams and vllm.inputs.TokensPrompt as plain data (vLLM encodes its own)."""
