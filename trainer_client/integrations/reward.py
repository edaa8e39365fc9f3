"""Rewards graded by the service (POST /verify) in the shapes trainers call them.

- verl's `custom_reward_function`: `compute_score` (one sample, async: verl's reward loop runs
  a batch's samples at once through its reward manager, and they are coalesced here into few
  POSTs). verl's reward loop has no `batch` reward manager any more (0.9: naive, dapo, remote,
  gdpo, each calling one sample at a time), so this is the batched path there.
- `compute_score_batch`: the whole batch, sync, one call; for a caller with a batch in hand
  (a script, or an older verl whose legacy `batch` reward manager calls it).
- Any trainer: `grade_responses` / `grade_responses_sync`.
- TRL's reward_funcs: `grade_or_none`, None for a sample that has no reward (TRL's documented
  "not applicable" value): its answer could not be judged, or a tool call of its rollout met an
  infrastructure status (`met_infrastructure` reads that from the rollout's tool responses).

A response scores 1.0 when the content of its last `\\boxed{}` equals the reference, 0.0 when it
is judged not to (or has no boxed answer). An answer the service could not judge after the
client's retries raises UnjudgedAnswerError: a step should fail rather than learn from a 0 that
says nothing about the answer.

The service is named by the `sandbox_url` (and `api_key`) argument, which verl passes from
`custom_reward_function.reward_kwargs`, else by RL_SANDBOX_URL (and RL_SANDBOX_API_KEY).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Sequence
from typing import Any

from trainer_client.errors import SandboxClientError
from trainer_client.integrations.answer import final_answer
from trainer_client.integrations.clients import ClientPerLoop, ServiceAddress, shared_sync_client
from trainer_client.integrations.coalesce import Coalescer
from trainer_client.wire import VerifyItem, VerifyResult

URL_VARIABLE = "RL_SANDBOX_URL"
API_KEY_VARIABLE = "RL_SANDBOX_API_KEY"
COALESCE_WAIT_S = 0.02
"""How long the first answer of a POST waits for others; verl starts a batch's samples at once."""
MAX_ITEMS_PER_POST = 256


class UnjudgedAnswerError(SandboxClientError):
    """The service could not judge an answer (queue_timeout or sandbox_error after retries)."""


def service_address(sandbox_url: str | None = None, api_key: str | None = None) -> ServiceAddress:
    """The service named by the arguments, else by RL_SANDBOX_URL / RL_SANDBOX_API_KEY."""
    url = sandbox_url or os.environ.get(URL_VARIABLE)
    if not url:
        raise ValueError(f"no sandbox service: pass sandbox_url= or set {URL_VARIABLE}")
    return ServiceAddress(url, api_key or os.environ.get(API_KEY_VARIABLE) or None)


def score_of(result: VerifyResult | None) -> float:
    """1.0 for a correct answer, 0.0 for a wrong or missing one (None); raises if unjudged."""
    if result is None:
        return 0.0
    if not result.judged:
        raise UnjudgedAnswerError(f"the service could not judge an answer: {result.reason}")
    return 1.0 if result.correct else 0.0


INFRASTRUCTURE_REASONS = frozenset(
    {"queue_timeout", "sandbox_error", "cancelled", "deadline_exceeded", "internal_error"}
)
"""The `reason:` of a tool response (format_tool_response, either style) that says the service,
not the program, failed: our infrastructure statuses, and code-judge's internal_error, the word
the rstar2 style uses for sandbox_error, cancelled and deadline_exceeded."""


def is_infrastructure_response(tool_response: str) -> bool:
    """Whether a tool response (as format_tool_response wrote it) reports an infrastructure
    status. Only its first two lines are read: the program's output comes after them, so a
    program cannot make its own call look like the service's failure."""
    head = tool_response.split("\n", 2)
    if len(head) < 2 or head[0] != "Tool call failure" or not head[1].startswith("reason: "):
        return False
    return head[1].removeprefix("reason: ").strip() in INFRASTRUCTURE_REASONS


def met_infrastructure(tool_responses: Sequence[str]) -> bool:
    """Whether any tool call of a rollout met an infrastructure status."""
    return any(is_infrastructure_response(text) for text in tool_responses)


def _items(responses: Sequence[str], references: Sequence[Any]) -> list[VerifyItem | None]:
    if len(responses) != len(references):
        raise ValueError(f"{len(responses)} responses but {len(references)} references")
    answers = [final_answer(r) for r in responses]
    return [
        None if a is None else VerifyItem(answer=a, reference=str(ref))
        for a, ref in zip(answers, references, strict=True)
    ]


def _scores(items: list[VerifyItem | None], verdicts: Sequence[VerifyResult]) -> list[float]:
    found = iter(verdicts)
    return [score_of(None if item is None else next(found)) for item in items]


async def grade_responses(
    responses: Sequence[str],
    references: Sequence[Any],
    *,
    address: ServiceAddress,
    timeout_s: float = 5.0,
) -> list[float]:
    """Scores of whole responses against references: one /verify call for the batch."""
    items = _items(responses, references)
    asked = [i for i in items if i is not None]
    verdicts = await _clients(address).get().verify(asked, timeout=timeout_s) if asked else []
    return _scores(items, verdicts)


async def grade_or_none(
    responses: Sequence[str],
    references: Sequence[Any],
    *,
    address: ServiceAddress,
    infrastructure: Sequence[bool] | None = None,
    timeout_s: float = 5.0,
) -> list[float | None]:
    """grade_responses, with None (no reward) for samples the service could not judge and for
    those whose rollout met an infrastructure status (`infrastructure[i]`, not graded at all)."""
    masked = list(infrastructure) if infrastructure is not None else [False] * len(responses)
    if len(masked) != len(responses):
        raise ValueError(f"{len(responses)} responses but {len(masked)} infrastructure flags")
    items = [
        None if m else item for m, item in zip(masked, _items(responses, references), strict=True)
    ]
    asked = [i for i in items if i is not None]
    verdicts = iter(await _clients(address).get().verify(asked, timeout=timeout_s) if asked else [])
    scores: list[float | None] = []
    for is_masked, item in zip(masked, items, strict=True):
        verdict = None if item is None else next(verdicts)
        if is_masked or (verdict is not None and not verdict.judged):
            scores.append(None)
        else:
            scores.append(score_of(verdict))
    return scores


def grade_responses_sync(
    responses: Sequence[str],
    references: Sequence[Any],
    *,
    address: ServiceAddress,
    timeout_s: float = 5.0,
) -> list[float]:
    """Blocking twin of grade_responses (through the process's shared sync client)."""
    items = _items(responses, references)
    asked = [i for i in items if i is not None]
    verdicts = shared_sync_client(address).verify(asked, timeout=timeout_s) if asked else []
    return _scores(items, verdicts)


_CLIENTS: dict[ServiceAddress, ClientPerLoop] = {}
_VerifyCoalescer = Coalescer[VerifyItem, VerifyResult]
_COALESCERS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[ServiceAddress, float], _VerifyCoalescer]
] = weakref.WeakKeyDictionary()


def _clients(address: ServiceAddress) -> ClientPerLoop:
    return _CLIENTS.setdefault(address, ClientPerLoop(address))


def _coalescer(address: ServiceAddress, timeout_s: float) -> _VerifyCoalescer:
    per_loop = _COALESCERS.setdefault(asyncio.get_running_loop(), {})
    key = (address, timeout_s)
    if key not in per_loop:
        clients = _clients(address)
        per_loop[key] = Coalescer(
            lambda items: clients.get().verify(items, timeout=timeout_s),
            MAX_ITEMS_PER_POST,
            COALESCE_WAIT_S,
        )
    return per_loop[key]


async def close_clients() -> None:
    """Close the running loop's clients of this module (a later call opens new ones)."""
    _COALESCERS.pop(asyncio.get_running_loop(), None)
    for clients in list(_CLIENTS.values()):
        await clients.aclose()


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    sandbox_url: str | None = None,
    api_key: str | None = None,
    verify_timeout_s: float = 5.0,
    **_: Any,
) -> float:
    """verl's custom reward function, one sample (verl's reward loop awaits many at once)."""
    answer = final_answer(solution_str)
    if answer is None:
        return 0.0
    coalescer = _coalescer(service_address(sandbox_url, api_key), verify_timeout_s)
    return score_of(await coalescer.submit(VerifyItem(answer=answer, reference=str(ground_truth))))


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any] | None] | None = None,
    *,
    sandbox_url: str | None = None,
    api_key: str | None = None,
    verify_timeout_s: float = 5.0,
    **_: Any,
) -> list[float]:
    """Every sample, one call (sync); the signature of verl's legacy `batch` reward manager."""
    return grade_responses_sync(
        solution_strs,
        ground_truths,
        address=service_address(sandbox_url, api_key),
        timeout_s=verify_timeout_s,
    )
