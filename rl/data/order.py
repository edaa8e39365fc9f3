"""The order in which a stage draws its items: epochs of fresh shuffles, resumable exactly.

Epoch e of a stream is a shuffle seeded by (seed, stream, e), so the whole order is a function of
its position (epoch, index): a resumed run that restores the position draws what an uninterrupted
run would have drawn, with no generator state to carry.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(slots=True)
class DrawOrder:
    """Indices into `size` items, drawn in epochs of shuffles."""

    size: int
    """How many items there are."""
    seed: int
    """The run's seed."""
    stream: str
    """Names the stream (the stage), so two stages draw independently."""
    epoch: int = 0
    """Epochs drawn to the end so far."""
    index: int = 0
    """Position inside the current epoch."""

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("need at least one item to draw from")

    def _epoch_order(self) -> list[int]:
        order = list(range(self.size))
        random.Random(f"{self.seed}:{self.stream}:{self.epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[int]:
        """The next n indices (an epoch boundary may fall inside them)."""
        out: list[int] = []
        order = self._epoch_order()
        while len(out) < n:
            if self.index == self.size:
                self.epoch, self.index = self.epoch + 1, 0
                order = self._epoch_order()
            step = min(n - len(out), self.size - self.index)
            out.extend(order[self.index : self.index + step])
            self.index += step
        return out

    def position(self) -> dict[str, int]:
        """Where the order stands, for a checkpoint."""
        return {"epoch": self.epoch, "index": self.index}
