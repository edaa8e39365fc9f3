"""What the worker's job path costs without a jail: RQ's loop and our edge, CPU per job.

Starts a private redis-server on a unix socket, enqueues N jobs the way the API's retries do
(JobQueue.enqueue: RQ's own job hash and queue push), and drains them with one LeanWorker whose
handler answers at once (no program runs). The worker listens on its own queue and the shared
one, as `rl-sandbox worker` does (RQ's BLPOP path). Prints the worker's CPU per job, and with
--profile the functions that take it (cProfile with a CPU clock), grouped as RQ's loop
(dequeue, job fetch, registries), our prepare and deliver pipelines, and the rest.

    .venv/bin/python scripts/profile_worker.py [--jobs 3000] [--chunk 32] [--profile]

--chunk N: the calls travel N to a job, as a batch's chunks do (jobs then counts calls).

Needs no jail and no lock: one process, one private Redis, nothing else.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import pstats
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import redis
from rq import Queue
from rq.job import Job

from sandbox_service import keys
from sandbox_service.broker.jobqueue import (
    JobHandler,
    JobQueue,
    LeanWorker,
    NewJob,
    connect_worker,
)
from sandbox_service.execution import Status
from sandbox_service.jobs import JobPayload, ResultDict, failure_result

QUEUE = "profile"


class Answer:
    """A handler that answers every job with a fixed small result (no program runs)."""

    def run(self, execution_id: str, payload: JobPayload) -> ResultDict:
        return failure_result(Status.OK, "", execution_id)

    def abandon(self, execution_id: str, payload: JobPayload, reason: str) -> ResultDict:
        return failure_result(Status.SANDBOX_ERROR, reason, execution_id)


class DequeueOnly(LeanWorker):
    """A LeanWorker that only dequeues: what RQ's loop costs without any of our per-job code."""

    def execute_job(self, job: Job, queue: Queue) -> None:
        pass


def jail_runner() -> JobHandler:
    """The worker's own handler with a warm jail in slot 0 (as `rl-sandbox worker` builds it)."""
    from sandbox_service.jail import JailExecutor
    from sandbox_service.settings import Settings
    from sandbox_service.worker.main import JobRunner

    settings = Settings()
    runner = JobRunner(settings, lambda: JailExecutor(settings, 0))
    runner.warm_up()
    return runner


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    sock = workdir / "redis.sock"
    proc = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly",
         "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"unix://{sock}"
    for _ in range(200):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except (redis.ConnectionError, FileNotFoundError):
            time.sleep(0.02)
    raise SystemExit("redis-server did not start")


def _commands(connection: redis.Redis) -> int:
    """Commands Redis has run so far (a Lua script's inner calls count too)."""
    stats = connection.info("commandstats")
    return sum(int(entry["calls"]) for entry in stats.values())


def enqueue_jobs(url: str, count: int, chunk: int = 1) -> None:
    """Enqueue `count` jobs (in a child process: the worker's CPU and instructions are its own,
    so that `valgrind --tool=callgrind` on this script counts the worker alone)."""
    queue = JobQueue(connect_worker(url), QUEUE, result_ttl_s=60)
    # A reply list, as the API gives every job (its notices pile up unread here).
    now = time.time()
    payload = JobPayload(
        code="print(1)",
        request_id="r",
        reply_to=f"{QUEUE}:reply",
        admitted_at=now,
        start_by=now + 3600,
    )
    if chunk > 1:
        items, budgets = (payload,) * chunk, (30.0,) * chunk
        chunks = [NewJob(uuid.uuid4().hex, payload, 30.0, items=items, item_budgets_s=budgets)
                  for _ in range(count // chunk)]  # fmt: skip
        queue.enqueue(chunks)
        return
    for start in range(0, count, 500):
        batch = range(start, min(start + 500, count))
        queue.enqueue([NewJob(uuid.uuid4().hex, payload, 30.0) for _ in batch])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--chunk", type=int, default=1, help="calls per job (a batch's chunks)")
    parser.add_argument(
        "--dequeue-only", action="store_true", help="RQ's loop alone: jobs are popped, not run"
    )
    parser.add_argument(
        "--jail",
        action="store_true",
        help="run each call in a real jail (the worker's JobRunner; root): the jail's exchange "
        "with the zygote counts with the worker, the zygote's own CPU does not",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rl-sandbox-profile-"))
    proc, url = start_redis(workdir)
    try:
        child = multiprocessing.get_context("fork").Process(
            target=enqueue_jobs, args=(url, args.jobs, args.chunk)
        )
        child.start()
        child.join()
        connection = connect_worker(url)
        name = "profile-worker"
        own_queue = keys.worker_queue(QUEUE, name)
        worker_class = DequeueOnly if args.dequeue_only else LeanWorker
        handler = jail_runner() if args.jail else Answer()
        worker = worker_class(handler, QUEUE, 60, own_queue, connection=connection, name=name)
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        redis_proc = psutil.Process(proc.pid)
        commands0, redis_cpu0 = _commands(connection), sum(redis_proc.cpu_times()[:2])
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        # Not burst mode: RQ then dequeues with one BLPOP on both queues, as in production
        # (burst mode LPOPs each queue in turn).
        worker.work(logging_level="WARNING", max_jobs=args.jobs // args.chunk, max_idle_time=5)
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        redis_cpu = sum(redis_proc.cpu_times()[:2]) - redis_cpu0
        commands = _commands(connection) - commands0 - 1  # less this INFO
        done = len(connection.keys(f"*{QUEUE}*result*")) or args.jobs
        print(
            f"{args.jobs} jobs ({done} results): worker CPU {1000 * cpu / args.jobs:.3f} ms/job, "
            f"{args.jobs / wall:.0f} jobs/s (one worker, Redis on a unix socket); Redis "
            f"{commands / args.jobs:.2f} commands/job (with those a script runs), "
            f"CPU {1000 * redis_cpu / args.jobs:.3f} ms/job"
        )
        if profiler:
            stats = pstats.Stats(profiler)
            stats.sort_stats("cumulative").print_stats(args.top)
            stats.sort_stats("tottime").print_stats(args.top)
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
