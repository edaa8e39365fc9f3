"""Every Redis key the service uses, in one place (pure: names only, no I/O).

Keys written by RQ itself follow RQ's own scheme and are named here too, so that one file answers
"what does rl-sandbox keep in Redis":

| key | type | written by | read by | lifetime |
|---|---|---|---|---|
| `rq:queue:<queue>` | list of job ids | API (enqueue) | workers (BLMOVE) | until dequeued |
| `rq:queue:<queue>:intermediate` | list | workers (BLMOVE) | workers | ~1 ms per job |
| `rq:job:<job_id>` | hash (RQ job; `data` is JSON) | API | workers, API watchdog | until finished |
| `rq:worker:<name>`, `rq:workers*` | RQ worker registry | workers | `rq info` | worker life |
| `<queue>:result:<job_id>` | string, JSON result | workers | API watchdog | `result_ttl_s` |
| `<queue>:reply:<api_id>` | list of completion notices | workers | its API | `result_ttl_s` |
| `<queue>:alive` | zset: worker -> last beat (epoch s) | workers, supervisor | API | pruned |
"""

from __future__ import annotations


def rq_queue(queue: str) -> str:
    """RQ's list of waiting job ids (its length is the queue depth)."""
    return f"rq:queue:{queue}"


def rq_job(job_id: str) -> str:
    """RQ's hash of one job."""
    return f"rq:job:{job_id}"


def result(queue: str, job_id: str) -> str:
    """The JSON result of one finished job, kept for recovery when its notice was lost."""
    return f"{queue}:result:{job_id}"


def reply(queue: str, api_id: str) -> str:
    """The list on which workers push completion notices for one API process."""
    return f"{queue}:reply:{api_id}"


def alive(queue: str) -> str:
    """Sorted set of worker names scored by their last heartbeat (epoch seconds)."""
    return f"{queue}:alive"
