"""`POST /verify`: batched answer checking in the workers' jails (see sandbox_service.verification).

The items of a request become a few executions admitted together (all or none: 429 when the
queue is full, as for /execute/batch); their verdict lines are read back and returned in the
order of the items. The API process never parses an answer itself.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError

import sandbox_service
from sandbox_service import verification
from sandbox_service.api.execute_routes import ERRORS
from sandbox_service.jobs import JobPayload, ResultDict
from sandbox_service.logs import request_id_var
from sandbox_service.settings import Settings
from trainer_client.wire import (
    VERIFY_ITEM_SLACK_S,
    VERIFY_MAX_ITEMS_PER_JOB,
    VERIFY_STARTUP_S,
    VerifyRequest,
    VerifyResponse,
    VerifyResult,
    verify_job_timeout_s,
)

RunPayloads = Callable[[list[JobPayload], str], Awaitable[list[ResultDict]]]
"""The API's execution path: admit the payloads whole or not at all, await their results."""

CHECKER_MODULE = "rl.reward.math_equal"
"""The answer checker, the trainer's own: its source runs in the jail, never imported here."""
VERIFY_MEMORY_MB = 1024
"""Memory of one verification job (the checker and its children, all together)."""


@functools.cache
def verify_code() -> str:
    """The program of every verification job (read once from the installed sources)."""
    driver = Path(sandbox_service.__file__).parent / "jail" / "verify_program.py"
    spec = importlib.util.find_spec(CHECKER_MODULE)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the answer checker {CHECKER_MODULE} is not installed")
    return verification.program(driver.read_text(), Path(spec.origin).read_text())


def verify_router(settings: Settings, run: RunPayloads) -> APIRouter:
    """The /verify route over the API's execution path."""
    router = APIRouter()

    @router.post(
        "/verify",
        response_model=VerifyResponse,
        responses={code: ERRORS[code] for code in (429, 503)},
    )
    async def verify(request: VerifyRequest) -> VerifyResponse:
        """Check answers against references (mathematical equivalence), in the workers' jails."""
        per_job = verification.items_per_job(request.timeout, settings.max_timeout)
        problems = []
        if per_job < 1:
            longest = settings.max_timeout - VERIFY_STARTUP_S - VERIFY_ITEM_SLACK_S
            problems.append(
                {
                    "type": "value_error",
                    "loc": ["body", "timeout"],
                    "msg": f"timeout must be <= {longest:g} on this server",
                    "input": request.timeout,
                }
            )
        if len(request.items) > settings.max_batch * VERIFY_MAX_ITEMS_PER_JOB:
            problems.append(
                {
                    "type": "too_long",
                    "loc": ["body", "items"],
                    "msg": f"at most {settings.max_batch * VERIFY_MAX_ITEMS_PER_JOB} items",
                    "input": None,
                }
            )
        if problems:
            raise RequestValidationError(problems)
        items = [verification.VerifyItem(i.answer, i.reference) for i in request.items]
        planned = verification.plan(items, per_job)
        code = verify_code()
        payloads = [
            JobPayload(
                code=code,
                stdin=verification.job_stdin(
                    [items[i] for i in job], request.timeout, request.rel_tol
                ),
                timeout_s=verify_job_timeout_s(len(job), request.timeout),
                memory_mb=VERIFY_MEMORY_MB,
                output_bytes=verification.job_output_bytes(len(job)),
                request_id=request_id_var.get(),
            )
            for job in planned.jobs
        ]
        verdicts = dict(planned.answered)
        if payloads:
            results = await run(payloads, "/verify")
            for job, result in zip(planned.jobs, results, strict=True):
                for index, verdict in zip(
                    job, verification.read_verdicts(result, len(job)), strict=True
                ):
                    verdicts[index] = verdict
        return VerifyResponse(
            results=[
                VerifyResult(verdict=v.verdict, reason=v.reason, detail=v.detail, time=v.time_s)
                for v in (verdicts[i] for i in range(len(items)))
            ]
        )

    return router
