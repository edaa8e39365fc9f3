"""Code rewards graded by the service's sealed grading (POST /grade), in verl's shapes.

A drop-in for verl's `sandbox_fusion` code reward (`verl.utils.reward_score.sandbox_fusion`),
which concatenates the response's code with the tests and passes it when it exits 0 (so an
`exit(0)` or an always-equal object earns full reward; docs/security.md). Here the grader
decides every case outside the candidate's jail.

- verl's `custom_reward_function`: `compute_score` (one sample, async; the samples verl's reward
  loop awaits together are coalesced into few POSTs) and `compute_score_batch` (sync).
- The response's code: its last fenced block (```python, or ```cpp/```c++ for C++), else the
  whole response.
- The datasets' fields (`ground_truth`, a dict or its JSON text; see `grade_request`):
    {"inputs": [...], "outputs": [...]}               APPS, TACO, CodeContests: stdio cases
    {"inputs": [...], "outputs": [...], "fn_name": f}  APPS/TACO call-based: function cases
    {"test_list": [...], "test_setup_code": "..."}     MBPP: each assert a case
    {"test": "def check(candidate): ...", "entry_point": f}  HumanEval: one `check(f)` case
    {"kind": "stdio" | "function" | "asserts", ...}    the service's own `tests` object
- The score: passed / total (`continuous=True`, as verl calls sandbox_fusion for code), else 1.0
  only when every case passed. A candidate the service could not grade after the client's
  retries raises UngradedError (its reward is null, never 0: a step should fail rather than
  learn from it).

The service is named by `sandbox_url`, or by `sandbox_fusion_url` (the key verl's config
already has), else by RL_SANDBOX_URL (and RL_SANDBOX_API_KEY).
"""

from __future__ import annotations

import asyncio
import json
import re
import weakref
from collections.abc import Sequence
from typing import Any

from trainer_client.errors import SandboxClientError
from trainer_client.grade_wire import GradeRequest, GradeResult
from trainer_client.integrations.clients import ClientPerLoop, ServiceAddress, shared_sync_client
from trainer_client.integrations.coalesce import Coalescer
from trainer_client.integrations.reward import service_address

COALESCE_WAIT_S = 0.02
MAX_PER_POST = 64
_FENCE = re.compile(r"```([A-Za-z0-9+#]*)[^\n]*\n(.*?)```", re.DOTALL)
_CPP_TAGS = ("cpp", "c++", "cc", "cxx")


class UngradedError(SandboxClientError):
    """The service could not grade a candidate (an infrastructure status after retries)."""


def extract_code(response: str) -> tuple[str, str]:
    """(language, code) of a response: its last fenced code block, else the whole text."""
    blocks = _FENCE.findall(response)
    if not blocks:
        return "python", response
    tag, code = blocks[-1]
    return ("cpp" if tag.lower() in _CPP_TAGS else "python"), code


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _tests(truth: dict[str, Any]) -> dict[str, Any]:
    if truth.get("kind") in ("stdio", "function", "asserts"):
        return truth
    if "test_list" in truth:
        asserts = [str(a) for a in truth["test_list"]]
        setup = str(truth.get("test_setup_code") or "")
        return {"kind": "asserts", "setup": setup, "asserts": asserts}
    if "test" in truth and "entry_point" in truth:
        check = f"check({truth['entry_point']})"
        return {"kind": "asserts", "setup": str(truth["test"]), "asserts": [check]}
    inputs, outputs = truth.get("inputs"), truth.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError("ground_truth has no tests this reward can read (see its module doc)")
    if truth.get("fn_name"):
        cases = [
            {
                "args": list(given) if isinstance(given, list) else [given],
                # APPS writes a call's expected value wrapped in a one-item list.
                "expected": wanted[0] if isinstance(wanted, list) and len(wanted) == 1 else wanted,
            }
            for given, wanted in zip(inputs, outputs, strict=True)
        ]
        return {"kind": "function", "entry_point": str(truth["fn_name"]), "cases": cases}
    cases = [
        {"stdin": _as_text(given), "expected_stdout": _as_text(wanted)}
        for given, wanted in zip(inputs, outputs, strict=True)
    ]
    return {"kind": "stdio", "cases": cases}


def grade_request(
    solution_str: str, ground_truth: Any, *, timeout_s: float = 10.0, memory_mb: int = 1024
) -> GradeRequest:
    """The grade request of a response and its dataset's ground truth (see the module doc)."""
    truth = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(truth, dict):
        raise ValueError("ground_truth must be a JSON object (or its text)")
    language, code = extract_code(solution_str)
    tests = _tests(truth)
    if tests["kind"] != "stdio":
        language = "python"
    return GradeRequest.model_validate(
        {
            "language": language,
            "code": code,
            "tests": tests,
            "timeout": timeout_s,
            "memory_mb": memory_mb,
        }
    )


def score_of(result: GradeResult, continuous: bool = True) -> float:
    """The reward of a graded result; raises UngradedError when the service did not grade it."""
    if result.reward is None:
        raise UngradedError(f"the service could not grade a candidate: {result.status}")
    if continuous:
        return result.reward
    return 1.0 if result.reward == 1.0 else 0.0


_CLIENTS: dict[ServiceAddress, ClientPerLoop] = {}
_COALESCERS: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[ServiceAddress, Coalescer[GradeRequest, GradeResult]]
] = weakref.WeakKeyDictionary()


def _coalescer(address: ServiceAddress) -> Coalescer[GradeRequest, GradeResult]:
    per_loop = _COALESCERS.setdefault(asyncio.get_running_loop(), {})
    if address not in per_loop:
        clients = _CLIENTS.setdefault(address, ClientPerLoop(address))
        per_loop[address] = Coalescer(
            lambda requests: clients.get().grade(requests), MAX_PER_POST, COALESCE_WAIT_S
        )
    return per_loop[address]


async def close_clients() -> None:
    """Close the running loop's clients of this module (a later call opens new ones)."""
    _COALESCERS.pop(asyncio.get_running_loop(), None)
    for clients in list(_CLIENTS.values()):
        await clients.aclose()


def _address(sandbox_url: str | None, sandbox_fusion_url: str | None, api_key: str | None) -> Any:
    return service_address(sandbox_url or sandbox_fusion_url, api_key)


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    sandbox_url: str | None = None,
    sandbox_fusion_url: str | None = None,
    api_key: str | None = None,
    continuous: bool = True,
    timeout: float = 10.0,
    memory_limit_mb: int = 1024,
    **_: Any,
) -> float:
    """verl's custom reward function for code, one sample (see the module doc)."""
    request = grade_request(
        solution_str, ground_truth, timeout_s=timeout, memory_mb=memory_limit_mb
    )
    coalescer = _coalescer(_address(sandbox_url, sandbox_fusion_url, api_key))
    return score_of(await coalescer.submit(request), continuous)


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[dict[str, Any] | None] | None = None,
    *,
    sandbox_url: str | None = None,
    sandbox_fusion_url: str | None = None,
    api_key: str | None = None,
    continuous: bool = True,
    timeout: float = 10.0,
    memory_limit_mb: int = 1024,
    **_: Any,
) -> list[float]:
    """Every sample, one call (sync); the signature of verl's `batch` reward manager."""
    requests = [
        grade_request(s, t, timeout_s=timeout, memory_mb=memory_limit_mb)
        for s, t in zip(solution_strs, ground_truths, strict=True)
    ]
    client = shared_sync_client(_address(sandbox_url, sandbox_fusion_url, api_key))
    return [score_of(result, continuous) for result in client.grade(requests)]
