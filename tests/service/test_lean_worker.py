"""LeanWorker's job path against a real Redis, no jail: start, read, deliver, skip, and RQ's view.

The worker runs in the test's main thread (RQ installs signal handlers, removed after each test
by `in_process_worker_signals`) for a fixed number of jobs, with a handler that records what it
was given and answers at once.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from sandbox_service import keys
from sandbox_service.broker.jobqueue import DequeuedJob, JobQueue, LeanWorker, NewJob
from sandbox_service.execution import Status
from sandbox_service.jobs import JobPayload, ResultDict, decode_notice, failure_result
from tests.signal_handlers import changed_handlers, signal_handlers
from tests.waiting import wait_until

pytestmark = pytest.mark.usefixtures("in_process_worker_signals")

REPLY = "lean-worker-test:reply"
RESULT_TTL_S = 300
"""Results' and notices' lifetime: longer than an in-process worker's occasional 60 s wait
after its jobs (seen under load, before this round's changes too), so that a slow teardown
cannot expire what the test reads."""


class Recorder:
    """A handler that records each job and the job hash as the handler saw it."""

    def __init__(self, connection: redis.Redis) -> None:
        self._redis = connection
        self.runs: list[tuple[str, JobPayload, list[bytes | None]]] = []

    def run(self, execution_id: str, payload: JobPayload) -> ResultDict:
        seen = self._redis.hmget(keys.rq_job(execution_id), ["status", "worker_name"])
        self.runs.append((execution_id, payload, seen))
        return failure_result(Status.OK, "", execution_id)

    def abandon(self, execution_id: str, payload: JobPayload, reason: str) -> ResultDict:
        return failure_result(Status.SANDBOX_ERROR, reason, execution_id)


@pytest.fixture
def queue_name(redis_client: redis.Redis) -> Iterator[str]:
    name = f"lean-{uuid.uuid4().hex[:8]}"
    yield name
    redis_client.delete(REPLY)


def _enqueue(redis_client: redis.Redis, queue_name: str, count: int) -> list[str]:
    ids = [uuid.uuid4().hex for _ in range(count)]
    payload = JobPayload(code="print(1)", request_id="r", reply_to=REPLY)
    JobQueue(redis_client, queue_name, result_ttl_s=RESULT_TTL_S).enqueue(
        [NewJob(i, payload, 30.0) for i in ids]
    )
    return ids


def _work(redis_client: redis.Redis, queue_name: str, jobs: int) -> tuple[Recorder, str]:
    handler = Recorder(redis_client)
    name = f"lean-worker-{uuid.uuid4().hex[:6]}"
    own = keys.worker_queue(queue_name, name)
    worker = LeanWorker(handler, queue_name, RESULT_TTL_S, own, connection=redis_client, name=name)
    worker.work(logging_level="WARNING", max_jobs=jobs, max_idle_time=5)
    return handler, name


def _notices(redis_client: redis.Redis) -> dict[str, ResultDict]:
    out = {}
    for raw in redis_client.lrange(REPLY, 0, -1):
        execution_id, result = decode_notice(raw)
        assert result is not None
        out[execution_id] = result
    return out


def test_jobs_run_started_by_the_worker_and_leave_only_their_results(
    redis_client: redis.Redis, queue_name: str
) -> None:
    ids = _enqueue(redis_client, queue_name, 3)
    handler, name = _work(redis_client, queue_name, 3)
    assert [run[0] for run in handler.runs] == ids
    for _, payload, seen in handler.runs:
        assert payload.code == "print(1)" and payload.reply_to == REPLY
        assert seen == [b"started", name.encode()]
    assert set(_notices(redis_client)) == set(ids)
    for execution_id in ids:
        assert not redis_client.exists(keys.rq_job(execution_id))
        assert redis_client.get(keys.result(queue_name, execution_id)) is not None
        assert 0 < redis_client.ttl(keys.result(queue_name, execution_id)) <= RESULT_TTL_S


def test_an_in_process_worker_changes_the_signal_handlers_the_fixture_puts_back(
    redis_client: redis.Redis, queue_name: str
) -> None:
    # What in_process_worker_signals is for (and no_leaked_signal_handlers fails a test without
    # it): a later SIGTERM to pytest would raise rq's StopRequested in another test.
    before = signal_handlers()
    _enqueue(redis_client, queue_name, 1)
    _work(redis_client, queue_name, 1)
    assert {"SIGINT", "SIGTERM"} <= set(changed_handlers(before, signal_handlers()))


def test_a_job_cancelled_before_its_start_is_answered_cancelled_without_running(
    redis_client: redis.Redis, queue_name: str
) -> None:
    (execution_id,) = _enqueue(redis_client, queue_name, 1)
    redis_client.set(keys.cancelled(queue_name, execution_id), 1, ex=60)
    handler, _ = _work(redis_client, queue_name, 1)
    assert handler.runs == []
    assert _notices(redis_client)[execution_id]["status"] == "cancelled"


def test_a_job_whose_hash_vanished_is_skipped_and_not_recreated(
    redis_client: redis.Redis, queue_name: str
) -> None:
    gone, kept = _enqueue(redis_client, queue_name, 2)
    redis_client.delete(keys.rq_job(gone))
    handler, _ = _work(redis_client, queue_name, 2)
    assert [run[0] for run in handler.runs] == [kept]
    assert not redis_client.exists(keys.rq_job(gone))
    assert set(_notices(redis_client)) == {kept}


def test_a_dequeued_job_reads_what_rq_reads_of_the_fields_the_worker_uses(
    redis_client: redis.Redis, queue_name: str
) -> None:
    # Guards DequeuedJob against RQ changing its hash: the fields it restores match Job.fetch.
    (execution_id,) = _enqueue(redis_client, queue_name, 1)
    key = keys.rq_job(execution_id)
    # No TTL on a waiting job: the worker need not PERSIST it at its start.
    assert redis_client.ttl(key) == -1
    full = Job.fetch(execution_id, connection=redis_client, serializer=JSONSerializer)
    lean = DequeuedJob(execution_id, connection=redis_client, serializer=JSONSerializer)
    lean.restore_fields(redis_client.hmget(key, DequeuedJob.FIELDS))
    assert (lean.id, lean.args, lean.timeout, lean.origin, lean.description) == (
        full.id,
        full.args,
        full.timeout,
        full.origin,
        full.description,
    )
    assert lean.get_status(refresh=False) == full.get_status(refresh=False)


def test_fair_share_charges_each_call_of_a_chunk(
    redis_client: redis.Redis, queue_name: str
) -> None:
    # Two equal tenants: heavy sends two chunks of 4 calls, light 8 single calls. Charged by
    # jobs, heavy's second chunk would run right after light's first call; charged by calls
    # and shared at the call, light's calls run between each chunk's calls, in turn.
    heavy, light = (keys.tenant_queue(queue_name, t) for t in ("heavy", "light"))
    payload = JobPayload(code="print(1)", request_id="r", reply_to=REPLY)
    chunks = [NewJob(f"c{c}", payload, 120.0, heavy, (payload,) * 4, (30.0,) * 4) for c in (1, 2)]
    singles = [NewJob(f"s{i}", payload, 30.0, light) for i in range(8)]
    handler = Recorder(redis_client)
    # Jobs of its own loop: c1, s3, c2, s7 (the others ran between the chunks' calls).
    _work_for_heavy_and_light(redis_client, queue_name, chunks + singles, handler, max_jobs=4)
    ran = [run[0] for run in handler.runs]
    heavy_calls = [f"c{c}.{i}" for c in (1, 2) for i in range(4)]
    light_calls = [f"s{i}" for i in range(8)]
    assert ran == [name for pair in zip(heavy_calls, light_calls, strict=True) for name in pair]
    assert set(_notices(redis_client)) == set(ran)


def _work_for_heavy_and_light(
    redis_client: redis.Redis, queue_name: str, jobs: list[NewJob], handler: Recorder, max_jobs: int
) -> None:
    """Enqueue `jobs`, then run one worker that shares its calls between tenants heavy and light
    at equal weights for `max_jobs` jobs of its own loop (jobs run between a chunk's calls do not
    count)."""
    JobQueue(redis_client, queue_name, result_ttl_s=RESULT_TTL_S).enqueue(jobs)
    name = f"lean-worker-{uuid.uuid4().hex[:6]}"
    worker = LeanWorker(
        handler,
        queue_name,
        RESULT_TTL_S,
        keys.worker_queue(queue_name, name),
        {"heavy": 1.0, "light": 1.0},
        connection=redis_client,
        name=name,
    )
    worker.work(logging_level="WARNING", max_jobs=max_jobs, max_idle_time=5)


class Sleeper(Recorder):
    """A Recorder whose calls named in `slow` sleep for `sleep_s` first."""

    def __init__(self, connection: redis.Redis, slow: set[str], sleep_s: float) -> None:
        super().__init__(connection)
        self._slow, self._sleep_s = slow, sleep_s

    def run(self, execution_id: str, payload: JobPayload) -> ResultDict:
        if execution_id in self._slow:
            time.sleep(self._sleep_s)
        return super().run(execution_id, payload)


def test_a_chunk_call_over_its_budget_is_abandoned_after_jobs_ran_between_its_calls(
    redis_client: redis.Redis, queue_name: str
) -> None:
    # Each job run between a chunk's calls installs RQ's death penalty on SIGALRM and removes
    # it (SIG_DFL); the chunk's next call must still end at its own budget, abandoned, and not
    # with the process (SIGALRM's default action) or answered after the whole sleep.
    heavy, light = (keys.tenant_queue(queue_name, t) for t in ("heavy", "light"))
    payload = JobPayload(code="print(1)", request_id="r", reply_to=REPLY)
    budgets = (30.0, 30.0, 0.3)
    chunk = NewJob("c1", payload, sum(budgets), heavy, (payload,) * 3, budgets)
    singles = [NewJob(f"s{i}", payload, 30.0, light) for i in range(2)]
    handler = Sleeper(redis_client, {"c1.2"}, sleep_s=5.0)
    _work_for_heavy_and_light(redis_client, queue_name, [chunk, *singles], handler, max_jobs=1)
    assert [run[0] for run in handler.runs] == ["c1.0", "s0", "c1.1", "s1"]
    notices = _notices(redis_client)
    assert notices["c1.2"]["status"] == Status.SANDBOX_ERROR.value, notices["c1.2"]
    assert "time budget" in notices["c1.2"]["stderr"], notices["c1.2"]
    assert all(notices[i]["status"] == Status.OK.value for i in ("c1.0", "s0", "c1.1", "s1"))


def test_a_worker_unsubscribes_at_shutdown_without_waiting_on_its_pubsub_thread(
    redis_client: redis.Redis, queue_name: str
) -> None:
    # RQ unsubscribes, then stops its pubsub thread with redis-py's stop(), which joins it: a
    # thread that read the unsubscribe reply first waits for a new subscription for RQ's 60 s
    # sleep time, past the supervisor's grace (the worker was then killed with its jails). Here
    # the thread is made to read that reply first, then the worker shuts down.
    worker = LeanWorker(
        Recorder(redis_client),
        queue_name,
        RESULT_TTL_S,
        connection=redis_client,
        name=f"unsub-{uuid.uuid4().hex[:6]}",
    )
    worker.subscribe()
    try:
        assert worker.pubsub is not None and worker.pubsub_thread is not None
        pubsub = worker.pubsub
        wait_until(lambda: pubsub.subscribed, "the pubsub thread subscribed", timeout_s=10)
        pubsub.unsubscribe()
        # The thread handled the reply, and waits for a new subscription.
        wait_until(lambda: not pubsub.subscribed, "the thread read the reply", timeout_s=10)
        teardown = threading.Thread(target=worker.unsubscribe, daemon=True)
        teardown.start()
        teardown.join(timeout=15)
        assert not teardown.is_alive(), "unsubscribe waited on the pubsub thread's 60 s sleep"
    finally:
        worker.pubsub_thread._running.clear()  # type: ignore[union-attr]
