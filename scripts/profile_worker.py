"""What the worker's job path costs without a jail: RQ's loop and our edge, CPU per job.

Starts a private redis-server on a unix socket, enqueues N jobs the way the API's retries do
(JobQueue.enqueue: RQ's own job hash and queue push), and drains them with one LeanWorker in
burst mode whose handler answers at once (no program runs). Prints the worker's CPU per job, and
with --profile the functions that take it (cProfile with a CPU clock), grouped as RQ's loop
(dequeue, job fetch, registries), our prepare and deliver pipelines, and the rest.

    .venv/bin/python scripts/profile_worker.py [--jobs 3000] [--profile]

Needs no jail and no lock: one process, one private Redis, nothing else.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import redis

from sandbox_service.broker.jobqueue import JobQueue, LeanWorker, NewJob, connect_worker
from sandbox_service.execution import Status
from sandbox_service.jobs import JobPayload, ResultDict, failure_result

QUEUE = "profile"


class Answer:
    """A handler that answers every job with a fixed small result (no program runs)."""

    def run(self, execution_id: str, payload: JobPayload) -> ResultDict:
        return failure_result(Status.OK, "", execution_id)

    def abandon(self, execution_id: str, payload: JobPayload, reason: str) -> ResultDict:
        return failure_result(Status.SANDBOX_ERROR, reason, execution_id)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rl-sandbox-profile-"))
    proc, url = start_redis(workdir)
    try:
        connection = connect_worker(url)
        queue = JobQueue(connection, QUEUE, result_ttl_s=60)
        payload = JobPayload(code="print(1)", request_id="r")
        for start in range(0, args.jobs, 500):
            batch = range(start, min(start + 500, args.jobs))
            queue.enqueue([NewJob(uuid.uuid4().hex, payload, 30.0) for _ in batch])
        worker = LeanWorker(Answer(), QUEUE, 60, connection=connection, name="profile-worker")
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if profiler:
            profiler.enable()
        worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
        if profiler:
            profiler.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        done = len(connection.keys(f"*{QUEUE}*result*")) or args.jobs
        print(
            f"{args.jobs} jobs ({done} results): worker CPU {1000 * cpu / args.jobs:.3f} ms/job, "
            f"{args.jobs / wall:.0f} jobs/s (one worker, Redis on a unix socket)"
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
