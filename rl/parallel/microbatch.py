"""Which rows go to which rank, and in which micro-batches (pure: lists of ints in and out).

A micro-batch costs its padded size, rows x longest row, in tokens; `token_budget` bounds it
(so that long rollouts go a few at a time and short ones many). Under data parallelism every
rank must run the same number of forward/backward passes (each is a collective under FSDP), so
the shorter plans are padded with empty micro-batches, which run a zero-weight pass.
"""

from __future__ import annotations

from collections.abc import Sequence


def split_balanced(lengths: Sequence[int], world_size: int) -> list[list[int]]:
    """Row indices for each rank, balancing token counts (longest row first, to the lightest)."""
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    parts: list[list[int]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        parts[rank].append(index)
        loads[rank] += lengths[index]
    return [sorted(part) for part in parts]


def token_budget_batches(
    rows: Sequence[int], lengths: Sequence[int], token_budget: int, *, max_rows: int = 0
) -> list[list[int]]:
    """rows split into micro-batches whose padded size (count x longest) fits token_budget
    and (max_rows > 0) whose count is at most max_rows; a row longer than the budget goes
    alone. Rows of similar length share a micro-batch."""
    if token_budget < 1:
        raise ValueError("token_budget must be at least 1")
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for row in sorted(rows, key=lambda r: (-lengths[r], r)):
        width = max(longest, lengths[row])
        full = bool(max_rows) and len(current) >= max_rows
        if current and (full or width * (len(current) + 1) > token_budget):
            batches.append(current)
            current, width = [], lengths[row]
        current.append(row)
        longest = width
    if current:
        batches.append(current)
    return batches


def pad_plan(batches: list[list[int]], count: int) -> list[list[int]]:
    """batches followed by empty ones up to count (the most any rank has)."""
    if count < len(batches):
        raise ValueError(f"cannot pad {len(batches)} micro-batches down to {count}")
    return batches + [[] for _ in range(count - len(batches))]
