"""What the API's watchdog does with one outstanding job, from what Redis says about it (pure).

The rule table, first match wins (`kind` is broker.jobqueue.JobState.kind):

kind       condition                           action    then
---------  ----------------------------------  --------  ----------------------------------------
done       a result is stored                  DELIVER   the request gets the result
queued     now > start_by + WITHDRAW_GRACE_S   WITHDRAW  queue_timeout if it was still queued (a
                                                         worker that took it meanwhile answers)
lost       attempt <= lost_job_retries         RETRY     enqueued again at the front, fresh
                                                         deadline, new id
lost       otherwise                           FAIL      sandbox_error
stranded   queued on a dead worker's own queue REROUTE   routed again, to the session's new owner
(other)                                        WAIT      checked again later

Jobs past their wait deadline are answered sandbox_error before any of this (Awaiter.check_once).
"""

from __future__ import annotations

import enum

WITHDRAW_GRACE_S = 0.5
"""A queued job is withdrawn this long after its start-by time (workers answer it themselves
when they dequeue it in between)."""


class Action(enum.Enum):
    """What the watchdog does with one job this round."""

    DELIVER = "deliver"
    WITHDRAW = "withdraw"
    RETRY = "retry"
    FAIL = "fail"
    REROUTE = "reroute"
    WAIT = "wait"


def decide(
    kind: str,
    has_result: bool,
    now_s: float,
    start_by_s: float,
    attempt: int,
    lost_job_retries: int,
) -> Action:
    """The action for a job in state `kind` (epoch seconds for now and its start-by time)."""
    if kind == "done" and has_result:
        return Action.DELIVER
    if kind == "queued" and now_s > start_by_s + WITHDRAW_GRACE_S:
        return Action.WITHDRAW
    if kind == "lost":
        return Action.RETRY if attempt <= lost_job_retries else Action.FAIL
    if kind == "stranded":
        return Action.REROUTE
    return Action.WAIT


def next_check_every(check_every_s: float, max_every_s: float) -> float:
    """The doubled interval before the job's next check, capped."""
    return min(check_every_s * 2, max_every_s)
