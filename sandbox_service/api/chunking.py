"""Which calls of one request share a queue job (pure).

A batch's stateless calls travel in chunks: one RQ job carries several calls, which one worker
runs in turn (jobqueue.LeanWorker._run_chunk), so a call costs a fraction of a job's round trips
and of the worker loop. There are CHUNKS_PER_WORKER chunks per live worker, so every worker
gets work and one that finishes early takes another chunk. A chunk holds the calls of one
group only, so that cancelling a group (or the request) takes whole chunks off the queue.
Session cells and session ends stay jobs of their own (routed to the session's owner).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sandbox_service.jobs import JobPayload

CHUNKS_PER_WORKER = 2
"""Chunks of one batch per live worker (more: better balance, fewer: fewer jobs)."""


def plan_chunks(
    payloads: Sequence[JobPayload], workers: int, per_worker: int = CHUNKS_PER_WORKER
) -> list[list[int]]:
    """The request's calls (indices into `payloads`) grouped into jobs: each list one job, a
    list of several a chunk. No chunk when there is no live worker or no call to share."""
    stateless = [i for i, p in enumerate(payloads) if p.session_id is None]
    size = math.ceil(len(stateless) / (workers * per_worker)) if workers > 0 else 1
    if size <= 1:
        return [[i] for i in range(len(payloads))]
    by_group: dict[str | None, list[int]] = {}
    for i in stateless:
        by_group.setdefault(payloads[i].group, []).append(i)
    plan = [[i] for i, p in enumerate(payloads) if p.session_id is not None]
    for indices in by_group.values():
        plan += [indices[start : start + size] for start in range(0, len(indices), size)]
    return plan
