"""The API writes RQ's records of a queued job itself (broker/rq_format.py): they must be what the
installed RQ writes for the same job, so that RQ reads them as its own (no Redis: the commands
are compared, never sent)."""

from __future__ import annotations

import json
import math
import zlib
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from sandbox_service import keys
from sandbox_service.broker.jobqueue import JOB_FUNC, JobQueue, NewJob
from sandbox_service.jobs import JobPayload

QUEUE = "q"
RESULT_TTL_S = 3600
TIMESTAMPS = ("created_at", "enqueued_at")


def _connection() -> redis.Redis:
    connection = redis.Redis(host="127.0.0.1", port=1)  # nothing listens: nothing is sent
    setattr(connection, "__rq_redis_server_version", (7, 0, 0))  # RQ's cache: no INFO
    return connection


def _rq_commands(jobs: list[NewJob], at_front: bool = False) -> list[tuple[Any, ...]]:
    """What RQ's own enqueue_many puts into a pipeline for these jobs (one queue each)."""
    connection = _connection()
    pipe = connection.pipeline(transaction=False)
    by_queue: dict[str, list[Any]] = {}
    for job in jobs:
        by_queue.setdefault(job.queue or QUEUE, []).append(
            Queue.prepare_data(
                JOB_FUNC,
                args=(job.payload.to_wire(),),
                timeout=math.ceil(job.budget_s),
                result_ttl=0,
                failure_ttl=RESULT_TTL_S,
                description=job.payload.request_id or job.execution_id,
                job_id=job.execution_id,
                at_front=at_front,
            )
        )
    for name, datas in by_queue.items():
        Queue(name, connection=connection, serializer=JSONSerializer).enqueue_many(
            datas, pipeline=pipe
        )
    return [tuple(args) for args, _ in pipe.command_stack]


def _hashes(commands: list[Any]) -> dict[str, dict[str, Any]]:
    """Each job key's fields as the HSETs leave them, timestamps and compression aside."""
    hashes: dict[str, dict[str, Any]] = {}
    for name, *args in commands:
        if name != "HSET":
            continue
        key, *pairs = args
        fields = hashes.setdefault(key, {})
        for field, value in zip(pairs[::2], pairs[1::2], strict=True):
            # As redis-py sends it: a str (RQ's JobStatus is a str enum) as its UTF-8 bytes.
            fields[field] = str.encode(value) if isinstance(value, str) else value
    for fields in hashes.values():
        fields["data"] = zlib.decompress(fields["data"])
        for field in TIMESTAMPS:
            assert fields.pop(field)
    return hashes


def _lists(commands: list[Any], at_front: bool) -> dict[str, list[str]]:
    """Each queue list as the pushes leave it (starting empty)."""
    lists: dict[str, list[str]] = {}
    for name, *args in commands:
        if name in ("RPUSH", "LPUSH"):
            key, *ids = args
            for job_id in ids:
                if name == "RPUSH":
                    lists.setdefault(key, []).append(job_id)
                else:
                    lists.setdefault(key, []).insert(0, job_id)
    return lists


def _jobs() -> list[NewJob]:
    plain = JobPayload(code="print(1)", request_id="req-1", reply_to="q:reply:a", admitted_at=1.5)
    cell = JobPayload(
        code="x = 1", session_id="s", files={"a.txt": "aGk="}, attempt=2, seed=2**32 - 1
    )
    return [
        NewJob("x1", plain, 39.2),
        NewJob("x2", cell, 700.0, queue=keys.worker_queue(QUEUE, "w1")),
        NewJob("x3", plain, 12.0),
    ]


def test_job_hashes_are_what_rq_writes() -> None:
    ours = JobQueue(_connection(), QUEUE, RESULT_TTL_S)._enqueue_commands(_jobs())
    assert _hashes(ours) == _hashes(_rq_commands(_jobs()))


def test_queues_are_registered_as_rq_does() -> None:
    ours = JobQueue(_connection(), QUEUE, RESULT_TTL_S)._enqueue_commands(_jobs())
    registered = {tuple(c) for c in ours if c[0] == "SADD"}
    assert registered == {tuple(c) for c in _rq_commands(_jobs()) if c[0] == "SADD"}


@pytest.mark.parametrize("at_front", [False, True])
def test_ids_are_pushed_in_order(at_front: bool) -> None:
    ours = JobQueue(_connection(), QUEUE, RESULT_TTL_S)._enqueue_commands(_jobs(), at_front)
    expected = {
        keys.rq_queue(QUEUE): ["x1", "x3"],
        keys.rq_queue(keys.worker_queue(QUEUE, "w1")): ["x2"],
    }
    assert _lists(ours, at_front) == expected


def test_rq_reads_the_hash_as_its_job() -> None:
    (command,) = [
        c
        for c in JobQueue(_connection(), QUEUE, RESULT_TTL_S)._enqueue_commands(_jobs()[:1])
        if c[0] == "HSET"
    ]
    pairs = command[2:]
    raw = {str(k).encode(): str(v).encode() if not isinstance(v, bytes) else v
           for k, v in zip(pairs[::2], pairs[1::2], strict=True)}  # fmt: skip
    job = Job("x1", connection=_connection(), serializer=JSONSerializer)
    job.restore(raw)
    assert job.func_name == JOB_FUNC
    assert list(job.args) == [_jobs()[0].payload.to_wire()]
    assert job.origin == QUEUE and job.timeout == 40 and job.description == "req-1"
    assert job.get_status(refresh=False) == "queued"
    assert job.created_at is not None and job.enqueued_at is not None


def test_a_payload_survives_its_wire_form() -> None:
    fork = JobPayload(code="", session_id="t/s", fork_to=("t/fork-1", "t/fork-2"), timeout_s=1.0)
    for payload in (*(job.payload for job in _jobs()), fork):
        assert JobPayload.from_wire(json.loads(json.dumps(payload.to_wire()))) == payload
