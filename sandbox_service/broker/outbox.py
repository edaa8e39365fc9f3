"""When a worker delivers the results of a chunk's calls (pure).

A chunk's calls run one after the other in one worker (api/chunking.py). Delivering each result
on its own costs a script round trip per call, about a fifth of the worker's CPU for a trivial
call; an `Outbox` keeps them and hands them over in one delivery (jobqueue.DELIVER_SCRIPT) when
`due` says so:

- the chunk's first call: its delivery also reads the cancel markers of the calls behind it,
  set before the worker had the chunk (later cancels reach the worker's cancel list),
- its last call (the same script deletes the job hash: its results are all stored),
- a call that ran FLUSH_AFTER_S or longer (its neighbours are not trivial: nothing to save),
- results that have waited FLUSH_AFTER_S, or hold FLUSH_BYTES of JSON (a bound on the
  worker's memory).

No request sees the difference: a batch is answered when its last call is. A worker that dies
mid-chunk leaves its undelivered calls to the API's watchdog, which runs them again, as it does
for the call a dying worker was running.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FLUSH_AFTER_S = 0.05
"""The longest a finished call's result waits for others (while the calls are short)."""
FLUSH_BYTES = 1 << 20
"""Results of this many bytes of JSON are delivered whatever their age."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One call's result as the delivery script takes it."""

    execution_id: str
    result_json: str
    notice: str
    """The waiting API's completion notice ("" when none waits)."""
    group: str
    """The Redis set of the call's group ("" when it has none)."""


@dataclass(slots=True)
class Outbox:
    """The results of a chunk's calls not delivered yet, oldest first."""

    items: list[Delivery] = field(default_factory=list)
    oldest_at: float = 0.0
    size: int = 0

    def add(self, delivery: Delivery, now: float) -> None:
        """Keep one call's result (`now`: a monotonic clock's reading)."""
        if not self.items:
            self.oldest_at = now
        self.items.append(delivery)
        self.size += len(delivery.result_json) + len(delivery.notice)

    def due(self, now: float, ran_s: float, first: bool, last: bool) -> bool:
        """Whether to deliver now, after a call that ran `ran_s` (see the module doc)."""
        return (
            first
            or last
            or ran_s >= FLUSH_AFTER_S
            or now - self.oldest_at >= FLUSH_AFTER_S
            or self.size >= FLUSH_BYTES
        )

    def take(self) -> list[Delivery]:
        """The kept results, emptying the outbox."""
        items, self.items, self.size = self.items, [], 0
        return items
