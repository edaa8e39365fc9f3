"""The order in which a worker tries its queues, so that tenants share saturated workers by weight
(pure: stride scheduling over queue names).

A worker dequeues from the first non-empty queue of its list (RQ's BLPOP over several queues).
After each job, the queue it came from advances its `pass` by 1 / weight, and the list is sorted
by pass: a queue that has been served less than its weight entitles it comes first. With every
queue backlogged, each worker (so the cluster) serves tenant t a fraction weight_t / sum(weights).

A queue that was empty meanwhile does not bank credit: when it is served again its pass starts
from the pass of the last queue served, so a light tenant is served at once when its call
arrives (its pass is the lowest), then takes its turn like the others, and cannot later
monopolise the worker with what it did not use.
"""

from __future__ import annotations

from collections.abc import Mapping


class FairOrder:
    """Stride scheduling over named queues with weights (> 0)."""

    def __init__(self, weights: Mapping[str, float]) -> None:
        if not weights or any(w <= 0 for w in weights.values()):
            raise ValueError("fair share needs at least one queue, every weight > 0")
        self._stride = {name: 1.0 / weight for name, weight in weights.items()}
        self._pass = dict.fromkeys(weights, 0.0)
        self._rank = {name: i for i, name in enumerate(weights)}
        self._last_pass = 0.0

    def order(self) -> list[str]:
        """The queue names, the one to try first first (ties: in the order given)."""
        return sorted(self._pass, key=lambda name: (self._pass[name], self._rank[name]))

    def served(self, name: str) -> None:
        """One job was taken from queue `name`."""
        if name not in self._pass:
            return
        start = max(self._pass[name], self._last_pass)
        self._last_pass = start
        self._pass[name] = start + self._stride[name]
