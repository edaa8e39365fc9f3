"""A worker's live-session capacity shared by tenant weight (pure).

Each worker holds at most `capacity` live session interpreters (max_sessions_per_worker). A tenant
may hold its share of them, capacity x weight / total weight (at least one), as it may hold its
share of the queue. A tenant that needs room for a new session or its forks evicts its own least
recently used sessions first (they are rebuilt from their records when used again); another
tenant's session is evicted only while that tenant holds more than its share (the weights
changed, or a tenant unknown here), so a tenant within its share never loses a live session to
another. `share` is the rule of every bound shared by weight: the API's unread answers and open
MCP sessions follow it too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sandbox_service.tenancy import tenant_of


def share(capacity: int, weights: Mapping[str, float], tenant: str) -> int:
    """Live sessions `tenant` may hold on a worker of `capacity` (a tenant not in `weights`
    counts with weight 1)."""
    weight = weights.get(tenant, 1.0)
    total = sum(weights.values()) + (0.0 if tenant in weights else 1.0)
    return max(1, math.floor(capacity * weight / total))


def evictions(
    live: Sequence[str],
    tenant: str,
    wanted: int,
    capacity: int,
    weights: Mapping[str, float],
) -> list[str] | None:
    """The sessions to end so that `tenant` may hold `wanted` more live sessions; `live` lists
    the live session ids, least recently used first. None when the tenant's share cannot hold
    `wanted` at all (a fork of more copies than its share)."""
    own_share = share(capacity, weights, tenant)
    if wanted > own_share:
        return None
    counts: dict[str, int] = {}
    for session_id in live:
        owner = tenant_of(session_id)
        counts[owner] = counts.get(owner, 0) + 1
    evicted: list[str] = []
    own_over = counts.get(tenant, 0) + wanted - own_share
    for session_id in live:
        if own_over <= 0:
            break
        if tenant_of(session_id) == tenant:
            evicted.append(session_id)
            own_over -= 1
    counts[tenant] = counts.get(tenant, 0) - len(evicted)
    total_over = len(live) - len(evicted) + wanted - capacity
    for session_id in live:
        if total_over <= 0:
            break
        owner = tenant_of(session_id)
        if owner != tenant and counts[owner] > share(capacity, weights, owner):
            evicted.append(session_id)
            counts[owner] -= 1
            total_over -= 1
    # Still over: every other tenant is within its share (more tenants than capacity); the
    # worker holds a few more than its capacity rather than take one of theirs.
    return evicted
