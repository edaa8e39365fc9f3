"""Every Redis key the service uses, in one place (pure: names only, no I/O).

Keys written by RQ itself follow RQ's own scheme and are named here too, so that one file answers
"what does rl-sandbox keep in Redis" (`<xid>` is an execution id, RQ's job id; `<id>` a session id):

| key | type | written by | read by | lifetime |
|---|---|---|---|---|
| `rq:queue:<queue>` | list of execution ids | API (enqueue) | workers (BLPOP) | until dequeued |
| `rq:job:<xid>` | hash (RQ job; `data` is JSON) | API | workers, API watchdog | until finished |
| `rq:worker:<name>`, `rq:workers*` | RQ worker registry | workers | `rq info` | worker life |
| `<queue>:result:<xid>` | string, JSON result | workers | API watchdog | `result_ttl_s` |
| `<queue>:reply:<api_id>` | list of completion notices | workers | its API | `result_ttl_s` |
| `<queue>:alive` | zset: worker -> last beat (epoch s) | workers, supervisor | API | pruned |
| `rq:queue:<queue>:w:<worker>` | list: a worker's own queue | API | that worker | dequeued |
| `<queue>:session:<id>` | hash: `owner` worker, `n` cells | API (claim), owner | both | TTL |
| `<queue>:cells:<id>` | list: recorded cells (JSON) | owner worker | restoring worker | TTL |
| `<queue>:segment:<hex>` | list: sealed cells forks share | owner (fork) | restoring worker | TTL |
| `<queue>:recorded-bytes:<t>` | hash: list key -> bytes, `total` | workers | API | pruned |
| `<queue>:recorded-until:<t>` | zset: list key -> expiry | workers, API | workers, API | pruned |
| `<queue>:cancelled:<xid>` | marker: its client left | API | workers, at start | job budget |
| `<queue>:cancel:<worker>` | list: execution ids to kill now | API | that worker | `result_ttl_s` |
| `<queue>:stats:<worker>` | string: JSON WorkerStats | that worker | API `/metrics` | >= 60 s |
| `<queue>:group:<g>` | set: group's unanswered ids, `-` | API, workers | any API | group TTL |
| `<queue>:gsessions:<g>` | set: sessions of group `<g>` | API | any API (cancel) | group TTL |
| `rq:queue:<queue>:t:<tenant>` | list: a tenant's shared queue | API | workers | dequeued |
| `rq:queue:<q>:chunks` | hash: waiting chunk job -> calls - 1 | API | workers, API | dequeued |
| `<queue>:tenants` | hash: tenant -> weight | API (start, every 10 s) | workers | none |
| `<queue>:in-flight:<tenant>` | zset: execution id -> give-up time | API | API | pruned |
| `<queue>:sessions-of:<tenant>` | zset: session id -> expiry | API | API | pruned |
| `<queue>:e2b:<sid>` | string: JSON E2B sandbox record | API | API | the sandbox's timeout |
| `<queue>:e2b-contexts:<sid>` | hash: context id -> JSON | API | API | the sandbox's timeout |
| `<queue>:e2b-cells:<sid>:<c>` | list: `[count, source]`, last cells | API | API | its timeout |
| `<queue>:e2b-lock:<sid>` | string: holder's token (context switch + cell) | API | API | 3 cells |
| `<queue>:e2b-owned:<tenant>` | zset: sandbox id -> end (epoch s) | API | API (list) | pruned |

Tenant "default" (an open server, or a single `api_key`) uses the shared queue `<queue>` itself,
so a deployment without a tenants file has the keys it always had. The two tenant zsets exist only
for tenants with a quota; their members carry the time they stop counting, so that an API replica
that dies with calls in flight leaks nothing past that time.

A chunk is one RQ job that carries several calls of a batch (`<xid>` of its item i:
`<chunk>.<i>`, so that its job is found from any of them). It waits in its tenant's shared queue
`<q>` (`<queue>` or `<queue>:t:<tenant>`), whose `rq:queue:<q>:chunks` lets the admission bound
and the tenant's share count its calls while it waits (named after the queue's list, so that the
admission script finds it from that key).
A session's recorded cells are its hash's `chain` (the ids of sealed segments, oldest first,
`based` cells in all) followed by its own `cells` list. A fork seals its parent's own list into a
segment (a rename) and gives each fork the chain by reference: stored once, however many forks
and forks of forks. Every stored list (a session's own or a segment) is charged to its tenant in
`recorded-bytes` until it expires (`recorded-until`, pruned by the scripts that read the total).
A worker's own queue holds the cells of the sessions it owns (served in turn with the shared
queue); the API watchdog moves what is queued there when the worker dies. TTL: `session_ttl_s`
since the session's last use. `<g>` is a group's internal id (`tenancy.scoped`: the tenant's name,
`/`, the client's label), so a group of one tenant never names another's; the member `-` (never
an execution id) marks a group as used, so a group whose calls all ended is still known (its
TTL: the session TTL plus the longest wait of a call, renewed at each admission). A session's
two keys have different prefixes (not `session:<id>:cells`) so that no session id, whatever it
contains, names another session's key.
"""

from __future__ import annotations


def rq_queue(queue: str) -> str:
    """RQ's list of waiting job ids (its length is the queue depth)."""
    return f"rq:queue:{queue}"


def rq_job(execution_id: str) -> str:
    """RQ's hash of one job."""
    return f"rq:job:{execution_id}"


def result(queue: str, execution_id: str) -> str:
    """The JSON result of one finished job, kept for recovery when its notice was lost."""
    return f"{queue}:result:{execution_id}"


def reply(queue: str, api_id: str) -> str:
    """The list on which workers push completion notices for one API process."""
    return f"{queue}:reply:{api_id}"


def alive(queue: str) -> str:
    """Sorted set of worker names scored by their last heartbeat (epoch seconds)."""
    return f"{queue}:alive"


def worker_queue(queue: str, worker: str) -> str:
    """The RQ queue name of one worker's own queue (its list is `rq_queue(worker_queue(...))`)."""
    return f"{queue}:w:{worker}"


def queue_worker(queue: str, rq_queue_name: str) -> str | None:
    """The worker whose own queue `rq_queue_name` is, or None for the shared queue."""
    prefix = f"{queue}:w:"
    return rq_queue_name[len(prefix) :] if rq_queue_name.startswith(prefix) else None


def rq_queues() -> str:
    """RQ's set of known queue keys (a dead worker's own queue is removed from it)."""
    return "rq:queues"


def session(queue: str, session_id: str) -> str:
    """Hash of one session: its owner worker and its number of recorded cells."""
    return f"{queue}:session:{session_id}"


def session_cells(queue: str, session_id: str) -> str:
    """List of one session's recorded cells, replayed to restore it on another worker."""
    return f"{queue}:cells:{session_id}"


def segment(queue: str, segment_id: str) -> str:
    """A sealed list of recorded cells that a session's forks share (by reference)."""
    return f"{queue}:segment:{segment_id}"


def recorded_bytes(queue: str, tenant: str) -> str:
    """Hash of a tenant's stored cell lists and segments -> their bytes, and `total`."""
    return f"{queue}:recorded-bytes:{tenant}"


def recorded_until(queue: str, tenant: str) -> str:
    """Sorted set of a tenant's stored cell lists and segments, scored by their expiry."""
    return f"{queue}:recorded-until:{tenant}"


def cancelled(queue: str, execution_id: str) -> str:
    """Marker of a job whose client went away: a worker that dequeues it does not run it."""
    return f"{queue}:cancelled:{execution_id}"


def cancel_list(queue: str, worker: str) -> str:
    """The list of execution ids that one worker must kill now (their clients went away)."""
    return f"{queue}:cancel:{worker}"


def group(queue: str, group_id: str) -> str:
    """Set of the execution ids of one group not yet answered (and the marker GROUP_USED)."""
    return f"{queue}:group:{group_id}"


GROUP_USED = "-"
"""The member of a group's set that says the group was used (never an execution id)."""


def group_sessions(queue: str, group_id: str) -> str:
    """Set of the session ids that ran a cell of one group (ended when the group is cancelled)."""
    return f"{queue}:gsessions:{group_id}"


def worker_stats(queue: str, worker: str) -> str:
    """One worker's own counters (JSON), refreshed with its heartbeat, read by `/metrics`."""
    return f"{queue}:stats:{worker}"


def chunks(queue: str) -> str:
    """Hash of the chunk jobs waiting in shared queue `queue` (RQ name, a tenant's):
    job id -> its calls beyond the first."""
    return f"{rq_queue(queue)}:chunks"


def tenant_queue(queue: str, tenant: str) -> str:
    """The RQ queue name of a tenant's shared queue (tenant "default": the shared queue)."""
    return queue if tenant == "default" else f"{queue}:t:{tenant}"


def in_flight(queue: str, tenant: str) -> str:
    """Sorted set of a tenant's admitted, unanswered execution ids, scored by give-up time."""
    return f"{queue}:in-flight:{tenant}"


def tenant_sessions(queue: str, tenant: str) -> str:
    """Sorted set of a tenant's live session ids (internal), scored by their expiry."""
    return f"{queue}:sessions-of:{tenant}"


def tenants(queue: str) -> str:
    """Hash of the tenants the API serves (name -> weight): which queues workers listen on."""
    return f"{queue}:tenants"


def e2b_sandbox(queue: str, sandbox_id: str) -> str:
    """One E2B-compatible sandbox's record (JSON), expiring with the sandbox."""
    return f"{queue}:e2b:{sandbox_id}"


def e2b_contexts(queue: str, sandbox_id: str) -> str:
    """Hash of one E2B sandbox's code contexts: context id -> JSON (cwd, language, cells run)."""
    return f"{queue}:e2b-contexts:{sandbox_id}"


def e2b_cells(queue: str, sandbox_id: str, context_id: str) -> str:
    """The last cells of an E2B sandbox's context: their sources, for its tracebacks."""
    return f"{queue}:e2b-cells:{sandbox_id}:{context_id}"


def e2b_lock(queue: str, sandbox_id: str) -> str:
    """Held by the API replica running a context's switch and cell in an E2B sandbox."""
    return f"{queue}:e2b-lock:{sandbox_id}"


def e2b_owned(queue: str, tenant: str) -> str:
    """Sorted set of a tenant's E2B sandbox ids scored by their end (epoch seconds)."""
    return f"{queue}:e2b-owned:{tenant}"
