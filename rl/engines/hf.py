"""TransformersEngine: an in-process engine over any transformers causal LM, CPU or GPU.

Continuous batching in cohorts. Requests that arrive together are prefilled together (left
padded) and then decoded one token per engine step; a finished row leaves its cohort at once
(`Cache.batch_select_indices`), so a turn that ends in `</tool_call>` is answered while the rest
keep decoding, and its tool call goes out immediately. Requests arriving while cohorts run form a
new cohort at the next step: no request waits for another to finish. Each engine step runs one
forward per cohort, so cohorts are capped (`max_cohorts`); past the cap new requests wait.

The model is shared with the trainer (colocated, same weights, nothing to sync): the trainer
does not update it while rollouts run. Forwards run on one worker thread so the event loop stays
free for the tool calls' HTTP traffic. Device-agnostic: tensors follow the model's device.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from rl.engines.base import Generation, SamplingParams, find_stop


@dataclass(eq=False, slots=True)
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass(eq=False, slots=True)
class _Cohort:
    rows: list[_Request]
    cache: Any
    attention_mask: torch.Tensor
    """(B, L) 1 on real tokens, 0 on left padding."""
    positions: torch.Tensor
    """(B,) position of the next input token of each row."""
    last: torch.Tensor
    """(B,) the token each row sampled last, fed at the next step."""


def sample_tokens(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its log-probability under the sampling distribution.

    logits: (B, V). temperature, top_p: (B,); temperature 0 is greedy (log-prob at temperature 1).
    Returns tokens (B,) int64 and logprobs (B,) float32. The log-prob is taken before top-p
    truncation, as vLLM reports it; with top_p = 1 (the recipe's) the two agree.
    """
    logits = logits.float()
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    if bool((top_p < 1).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Drop a token when the mass before it already reaches top_p (the first always stays).
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= top_p.unsqueeze(-1)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
    sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    tokens = torch.where(greedy, logits.argmax(-1), sampled)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class TransformersEngine:
    """Generates assistant turns with a transformers model, many requests continuously batched."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "hf0",
        capacity_tokens: int = 65536,
        max_cohorts: int = 8,
        pad_token_id: int | None = None,
        seed: int = 0,
        autocast_dtype: torch.dtype | None = None,
    ) -> None:
        """model: a transformers causal LM; tokenizer: its tokenizer (for stop strings)."""
        if capacity_tokens < 1 or max_cohorts < 1:
            raise ValueError("capacity_tokens and max_cohorts must be at least 1")
        self._model = model
        self._tokenizer = tokenizer
        self._name = name
        self._capacity = capacity_tokens
        self._max_cohorts = max_cohorts
        pad = pad_token_id if pad_token_id is not None else tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else tokenizer.eos_token_id)
        self._device = next(model.parameters()).device
        self._autocast_dtype = autocast_dtype
        self._generator = torch.Generator(device=self._device).manual_seed(seed)
        params = inspect.signature(model.forward).parameters
        # transformers 5 renamed past_key_values to cache; support both.
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self._pending: list[_Request] = []
        self._cohorts: list[_Cohort] = []
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"engine-{name}")
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._single_token_stops: dict[str, int] = {}
        self.forwards = 0
        self.generated_tokens = 0
        self.busy_s = 0.0
        self.peak_tokens_in_use = 0

    @property
    def name(self) -> str:
        """This engine's name in reports."""
        return self._name

    @property
    def capacity_tokens(self) -> int:
        """The token capacity the scheduler may reserve (a budget: this engine has no paged KV)."""
        return self._capacity

    @property
    def model(self) -> Any:
        """The model it samples from (the trainer's own, when colocated)."""
        return self._model

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample one turn; returns when this request (not its cohort) has finished."""
        if not prompt_ids:
            raise ValueError("empty prompt")
        if len(prompt_ids) >= self._max_positions:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens exceeds the model's context")
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wakeup = asyncio.Event()
            self._task = loop.create_task(self._run(), name=f"engine-{self._name}")
        request = _Request(list(prompt_ids), params, loop.create_future())
        self._pending.append(request)
        assert self._wakeup is not None
        self._wakeup.set()
        return await request.future

    def rng_state(self) -> torch.Tensor:
        """The sampling generator's state, for a checkpoint (call between rollouts)."""
        return self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore the sampling generator from rng_state() (a resumed run)."""
        self._generator.set_state(state)

    async def aclose(self) -> None:
        """Stop the engine loop and its thread; waiting requests are cancelled."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for request in self._pending + [r for c in self._cohorts for r in c.rows]:
            if not request.future.done():
                request.future.cancel()
        self._pending, self._cohorts = [], []
        self._executor.shutdown(wait=True)

    def stats(self) -> dict[str, float]:
        """Counters for utilisation reports."""
        return {
            "forwards": float(self.forwards),
            "generated_tokens": float(self.generated_tokens),
            "busy_s": self.busy_s,
            "peak_tokens_in_use": float(self.peak_tokens_in_use),
        }

    # --- the engine loop (event-loop side) ----------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wakeup is not None
        while True:
            if not self._pending and not self._cohorts:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            admit: list[_Request] = []
            if self._pending and len(self._cohorts) < self._max_cohorts:
                admit, self._pending = self._pending, []
            try:
                finished = await loop.run_in_executor(self._executor, self._step, admit)
            except Exception as exc:  # a failed forward fails its requests, not the engine
                for request in admit + [r for c in self._cohorts for r in c.rows]:
                    if not request.future.done():
                        request.future.set_exception(exc)
                self._cohorts = []
                continue
            for request, generation in finished:
                if not request.future.done():
                    request.future.set_result(generation)
            await asyncio.sleep(0)

    # --- the worker thread side ---------------------------------------------------------------

    def _step(self, admit: list[_Request]) -> list[tuple[_Request, Generation]]:
        started = time.perf_counter()
        finished: list[tuple[_Request, Generation]] = []
        amp = (
            torch.autocast(self._device.type, dtype=self._autocast_dtype)
            if self._autocast_dtype is not None
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), amp:
            stepped = list(self._cohorts)
            if admit:
                self._cohorts.append(self._prefill(admit))
            for cohort in stepped:
                self._decode(cohort)
            survivors = []
            for cohort in self._cohorts:
                finished.extend(self._retire(cohort))
                if cohort.rows:
                    survivors.append(cohort)
            self._cohorts = survivors
        in_use = sum(len(r.prompt_ids) + len(r.token_ids) for c in self._cohorts for r in c.rows)
        self.peak_tokens_in_use = max(self.peak_tokens_in_use, in_use)
        self.busy_s += time.perf_counter() - started
        return finished

    def _forward(self, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        cache = kwargs.pop("cache", None)
        if cache is not None:
            kwargs[self._cache_kwarg] = cache
        out = self._model(use_cache=True, logits_to_keep=1, **kwargs)
        self.forwards += 1
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = out.past_key_values
        return out.logits[:, -1, :], new_cache

    def _prefill(self, rows: list[_Request]) -> _Cohort:
        width = max(len(r.prompt_ids) for r in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row.prompt_ids) :] = torch.tensor(row.prompt_ids)
            mask[i, width - len(row.prompt_ids) :] = 1
        ids, mask = ids.to(self._device), mask.to(self._device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(input_ids=ids, attention_mask=mask, position_ids=positions)
        cohort = _Cohort(rows, cache, mask, positions[:, -1] + 1, ids[:, -1])
        self._sample_into(cohort, logits)
        return cohort

    def _decode(self, cohort: _Cohort) -> None:
        ones = torch.ones((len(cohort.rows), 1), dtype=torch.long, device=self._device)
        cohort.attention_mask = torch.cat([cohort.attention_mask, ones], dim=1)
        logits, cohort.cache = self._forward(
            input_ids=cohort.last.unsqueeze(-1),
            attention_mask=cohort.attention_mask,
            position_ids=cohort.positions.unsqueeze(-1),
            cache=cohort.cache,
        )
        cohort.positions = cohort.positions + 1
        self._sample_into(cohort, logits)

    def _sample_into(self, cohort: _Cohort, logits: torch.Tensor) -> None:
        temperature = torch.tensor(
            [r.params.temperature for r in cohort.rows], device=self._device, dtype=torch.float32
        )
        top_p = torch.tensor(
            [r.params.top_p for r in cohort.rows], device=self._device, dtype=torch.float32
        )
        tokens, logprobs = sample_tokens(logits, temperature, top_p, self._generator)
        cohort.last = tokens
        for row, token, logprob in zip(
            cohort.rows, tokens.tolist(), logprobs.tolist(), strict=True
        ):
            row.token_ids.append(int(token))
            row.logprobs.append(float(logprob))
        self.generated_tokens += len(cohort.rows)

    def _retire(self, cohort: _Cohort) -> list[tuple[_Request, Generation]]:
        done: list[tuple[_Request, Generation]] = []
        keep: list[int] = []
        for i, row in enumerate(cohort.rows):
            generation = self._finished(row)
            if generation is None:
                keep.append(i)
            else:
                done.append((row, generation))
        if done:
            cohort.rows = [cohort.rows[i] for i in keep]
            if keep:
                index = torch.tensor(keep, dtype=torch.long, device=self._device)
                cohort.cache.batch_select_indices(index)
                cohort.attention_mask = cohort.attention_mask[index]
                cohort.positions = cohort.positions[index]
                cohort.last = cohort.last[index]
        return done

    def _stop_token(self, stop: str) -> int | None:
        if stop not in self._single_token_stops:
            ids = self._tokenizer.encode(stop, add_special_tokens=False)
            self._single_token_stops[stop] = int(ids[0]) if len(ids) == 1 else -1
        token = self._single_token_stops[stop]
        return token if token >= 0 else None

    def _finished(self, row: _Request) -> Generation | None:
        params, last = row.params, row.token_ids[-1]
        if last in params.stop_token_ids:
            return self._generation(row, "stop", last)
        multi_token = []
        for stop in params.stop:
            if self._stop_token(stop) == last:
                return self._generation(row, "stop", stop)
            if self._stop_token(stop) is None:
                multi_token.append(stop)
        if multi_token:
            longest = max(len(s) for s in multi_token)
            tail = self._tokenizer.decode(row.token_ids[-(longest + 2) :])
            hit = find_stop(tail, multi_token)
            if hit is not None:
                return self._generation(row, "stop", hit[1])
        total = len(row.prompt_ids) + len(row.token_ids)
        if len(row.token_ids) >= params.max_new_tokens or total >= self._max_positions:
            return self._generation(row, "length", None)
        return None

    def _generation(self, row: _Request, reason: str, stop: str | int | None) -> Generation:
        return Generation(
            token_ids=list(row.token_ids),
            logprobs=list(row.logprobs),
            finish_reason="stop" if reason == "stop" else "length",
            stop=stop,
        )
