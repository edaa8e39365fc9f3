"""The group and deadline of a call on the peer-compatible routes, carried in headers.

code-judge's and SandboxFusion's request bodies have no place for them (their clients send only
their own fields), so a trainer that keeps its peer client sets two headers instead, which every
HTTP client can add: `X-RL-Sandbox-Group` and `X-RL-Sandbox-Deadline` (seconds, as
`deadline_s`). They apply to every call of the request; invalid values are a 422 naming them.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated

from fastapi import Header

from trainer_client.wire import GROUP_PATTERN, MAX_DEADLINE_S, ExecuteRequest


@dataclass(frozen=True, slots=True)
class CallLabels:
    """Group and relative deadline for every call of one request (None: not set)."""

    group: str | None = None
    deadline_s: float | None = None


NO_LABELS = CallLabels()
labels_var: ContextVar[CallLabels] = ContextVar("call_labels", default=NO_LABELS)
"""The labels of the request the current task serves (set by `read_call_labels`)."""


async def read_call_labels(
    x_rl_sandbox_group: Annotated[
        str | None,
        Header(pattern=GROUP_PATTERN, description="The group of every call of this request"),
    ] = None,
    x_rl_sandbox_deadline: Annotated[
        float | None,
        Header(
            gt=0,
            le=MAX_DEADLINE_S,
            allow_inf_nan=False,
            description="Seconds from admission after which the calls' results are not wanted",
        ),
    ] = None,
) -> None:
    """A route dependency: bind the request's labels (a coroutine, so the route's task sees
    them)."""
    labels_var.set(CallLabels(x_rl_sandbox_group, x_rl_sandbox_deadline))


def labelled(request: ExecuteRequest) -> ExecuteRequest:
    """`request` with the current request's labels where it has none of its own."""
    labels = labels_var.get()
    update: dict[str, object] = {}
    if labels.group is not None and request.group is None:
        update["group"] = labels.group
    if labels.deadline_s is not None and request.deadline_s is None:
        update["deadline_s"] = labels.deadline_s
    return request.model_copy(update=update) if update else request
