"""How rollouts are graded: in the trainer's own verifier pool, or by the service's POST /verify.

Both score an answer as rl.reward.outcome does (1.0 when the last boxed answer equals the
ground truth, else 0.0; no answer, one too long, a time-out or an unparsable one: 0.0), with the
same checker (rl/reward/math_equal.py runs in the service's jails too). The service grader is
asked per rollout as each one finishes, so grading overlaps the rollouts still running; the
answers that finish within `max_wait_s` of each other go in one request. An answer the service
could not judge even after the client's retries (queue_timeout, sandbox_error) raises: a reward
of 0.0 for an overloaded service would be a wrong training signal, not a verdict.

Code problems are graded by the service's sealed POST /grade instead (CodeGrader): the reward
is the passed fraction of the problem's tests (its ground truth is the spec's `tests` object as
JSON) for the last fenced code block of the answer; no block is 0.0, and a candidate the service
could not grade raises as above.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import TypeAdapter, ValidationError

from rl.reward.answer import extract_answer, extract_code
from rl.reward.outcome import MAX_ANSWER_CHARS, answer_rewards
from rl.reward.verifier import VerifierPool
from trainer_client.grade import MAX_GRADES_PER_REQUEST
from trainer_client.grade_wire import GradeRequest, GradeResult, Tests
from trainer_client.integrations.coalesce import Coalescer
from trainer_client.verify import MAX_ITEMS_PER_REQUEST
from trainer_client.wire import VerifyItem, VerifyResult

_TESTS: TypeAdapter[Any] = TypeAdapter(Tests)


class UnjudgedAnswerError(RuntimeError):
    """The service could not judge an answer within the client's retry policy."""


class Verifies(Protocol):
    """What the service grader needs of a client (trainer_client.SandboxClient has it)."""

    async def verify(
        self,
        items: Sequence[VerifyItem | tuple[str, str]],
        *,
        timeout: float = ...,  # noqa: ASYNC109 (the check limit, named as the API field)
        rel_tol: float = ...,
    ) -> list[VerifyResult]: ...


class Grades(Protocol):
    """What the code grader needs of a client (trainer_client.SandboxClient has it)."""

    async def grade(
        self, requests: Sequence[GradeRequest | dict[str, Any]]
    ) -> list[GradeResult]: ...


class ServiceClient(Verifies, Grades, Protocol):
    """A client of both graders' routes (trainer_client.SandboxClient)."""


class Grader(Protocol):
    """Rewards of finished rollouts' texts against their ground truths."""

    per_rollout: bool
    """True: grade each rollout as it finishes (reward); False: the whole batch after (rewards)."""

    async def reward(self, response: str, truth: str) -> float: ...

    async def rewards(self, responses: Sequence[str], truths: Sequence[str]) -> list[float]: ...


async def each_reward(
    grader: Grader, responses: Sequence[str], truths: Sequence[str]
) -> list[float]:
    """A per-rollout grader's rewards of a batch: each rollout's `reward`, concurrently."""
    if len(responses) != len(truths):
        raise ValueError(f"{len(responses)} responses but {len(truths)} ground truths")
    return list(
        await asyncio.gather(*(grader.reward(r, t) for r, t in zip(responses, truths, strict=True)))
    )


@dataclass(eq=False, slots=True)
class LocalGrader:
    """The trainer's own verifier pool, after the rollouts (offline, or no service at hand)."""

    pool: VerifierPool
    fallback_to_last_boxed: bool = False
    per_rollout: bool = False

    async def reward(self, response: str, truth: str) -> float:
        return (await self.rewards([response], [truth]))[0]

    async def rewards(self, responses: Sequence[str], truths: Sequence[str]) -> list[float]:
        return answer_rewards(
            responses,
            truths,
            fallback_to_last_boxed=self.fallback_to_last_boxed,
            verifier=self.pool,
        )


class ServiceGrader:
    """The service's POST /verify, per rollout as it finishes, micro-batched."""

    per_rollout = True

    def __init__(
        self,
        client: Verifies,
        *,
        timeout_s: float = 5.0,
        rel_tol: float = 1e-6,
        fallback_to_last_boxed: bool = False,
        max_wait_s: float = 0.05,
    ) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.rel_tol = rel_tol
        self.fallback_to_last_boxed = fallback_to_last_boxed
        self.max_wait_s = max_wait_s
        self._batches: Coalescer[VerifyItem, VerifyResult] = Coalescer(
            lambda items: client.verify(items, timeout=timeout_s, rel_tol=rel_tol),
            MAX_ITEMS_PER_REQUEST,
            max_wait_s,
        )

    async def reward(self, response: str, truth: str) -> float:
        if not truth.strip():
            raise ValueError("empty ground truth")
        answer = extract_answer(response, fallback_to_last_boxed=self.fallback_to_last_boxed)
        if answer is None or len(answer) > MAX_ANSWER_CHARS:
            return 0.0
        result = await self._batches.submit(VerifyItem(answer=answer, reference=truth))
        if not result.judged:
            why = f"{result.reason} {result.detail}".rstrip()
            raise UnjudgedAnswerError(f"the service did not judge {answer[:60]!r}: {why}")
        return 1.0 if result.correct else 0.0

    async def rewards(self, responses: Sequence[str], truths: Sequence[str]) -> list[float]:
        return await each_reward(self, responses, truths)


def parse_tests(truth: str) -> Any:
    """A code problem's ground truth: the spec's `tests` object as JSON, checked as on the wire."""
    try:
        return _TESTS.validate_python(json.loads(truth))
    except (ValueError, ValidationError) as exc:
        raise ValueError(f"a code problem's ground truth is not a `tests` object: {exc}") from exc


def grade_request(
    response: str, truth: str, *, fallback_to_last_block: bool
) -> GradeRequest | None:
    """The grade request of a response's final code against its truth; None: no code to grade."""
    tests = parse_tests(truth)
    found = extract_code(response, fallback_to_last_block=fallback_to_last_block)
    if found is None:
        return None
    language, code = found
    if tests.kind != "stdio":  # function and asserts tests call Python
        language = "python"
    try:
        return GradeRequest(language=language, code=code, tests=tests)
    except ValidationError:  # code the wire refuses (a lone surrogate) cannot pass
        return None


class CodeGrader:
    """The service's POST /grade of each rollout's final code, as it finishes, micro-batched."""

    per_rollout = True

    def __init__(
        self, client: Grades, *, fallback_to_last_block: bool = False, max_wait_s: float = 0.05
    ) -> None:
        self.client = client
        self.fallback_to_last_block = fallback_to_last_block
        self.max_wait_s = max_wait_s
        self._batches: Coalescer[GradeRequest, GradeResult] = Coalescer(
            client.grade, MAX_GRADES_PER_REQUEST, max_wait_s
        )

    async def reward(self, response: str, truth: str) -> float:
        request = grade_request(response, truth, fallback_to_last_block=self.fallback_to_last_block)
        if request is None:
            return 0.0
        result = await self._batches.submit(request)
        if result.reward is None:
            raise UnjudgedAnswerError(
                f"the service did not grade {request.code[:60]!r}: {result.status}"
            )
        return result.reward

    async def rewards(self, responses: Sequence[str], truths: Sequence[str]) -> list[float]:
        return await each_reward(self, responses, truths)
