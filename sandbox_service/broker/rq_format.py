"""RQ's Redis records of a queued job, written as RQ 3 writes them, without its Job object (pure).

The API enqueues every call, and RQ's own path (Queue.prepare_data, Queue.enqueue_many: a Job
object, its to_dict, a command pipeline never sent) cost 50 us of the API's CPU per job here,
against 16 here (11 in large rounds). The records are the same: the queue registered in
`rq:queues`, the job hash with the fields Job.to_dict gives a job enqueued with only a function,
its arguments, a timeout, TTLs, a description and an id (`data`: the JSON serializer's
`[func, null, args, {}]`, zlib-compressed), and the id pushed on the queue's list. So RQ reads them
as its own jobs (`rq info`, Job.fetch, a stock worker); tests/unit/test_rq_format.py compares the
hash with what the installed RQ writes for the same job.
"""

from __future__ import annotations

import datetime
import json
import zlib
from collections.abc import Sequence
from typing import Any

TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
"""RQ's utcformat."""


def timestamp(at: datetime.datetime | None = None) -> str:
    """A time in RQ's format (UTC, microseconds); now by default."""
    return (at or datetime.datetime.now(datetime.UTC)).strftime(TIMESTAMP_FORMAT)


def job_data(func_name: str, args: Sequence[Any]) -> bytes:
    """The job's `data` field: RQ's JSON serializer's (func, instance, args, kwargs), compressed."""
    return zlib.compress(json.dumps([func_name, None, list(args), {}]).encode())


def job_args(data: bytes) -> list[Any]:
    """The arguments of a job from its `data` field (inverse of job_data)."""
    try:
        decoded = json.loads(zlib.decompress(data))
    except zlib.error as exc:
        raise ValueError(f"job data not compressed: {exc}") from exc
    args = decoded[2]
    if not isinstance(args, list):
        raise ValueError("job data without an argument list")
    return args


def job_fields(
    *,
    data: bytes,
    origin: str,
    description: str,
    timeout_s: int,
    result_ttl_s: int,
    failure_ttl_s: int,
    now: str,
) -> list[Any]:
    """The HSET field/value pairs of a queued job, flat, in Job.to_dict's order."""
    return [
        "created_at", now,
        "data", data,
        "success_callback_name", "",
        "failure_callback_name", "",
        "stopped_callback_name", "",
        "started_at", "",
        "ended_at", "",
        "last_heartbeat", "",
        "worker_name", "",
        "group_id", "",
        "origin", origin,
        "description", description,
        "enqueued_at", now,
        "timeout", timeout_s,
        "result_ttl", result_ttl_s,
        "failure_ttl", failure_ttl_s,
        "status", "queued",
    ]  # fmt: skip
