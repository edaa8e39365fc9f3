"""A worker's live sessions shared by tenant weight (pure)."""

from __future__ import annotations

from sandbox_service.session_shares import evictions, share
from sandbox_service.tenancy import tenant_of


def test_the_tenant_is_the_prefix_of_the_internal_id() -> None:
    assert tenant_of("alpha/s-1") == "alpha"
    assert tenant_of("alpha/a/b") == "alpha"
    assert tenant_of("no-slash") == "default"


def test_shares_follow_the_weights_with_at_least_one() -> None:
    weights = {"a": 1.0, "b": 3.0}
    assert (share(16, weights, "a"), share(16, weights, "b")) == (4, 12)
    assert share(16, {"default": 1.0}, "default") == 16
    assert share(16, {}, "default") == 16
    assert share(2, {"a": 1.0, "b": 1.0, "c": 1.0}, "a") == 1
    assert share(16, {"a": 1.0}, "stranger") == 8


def test_a_tenant_at_its_share_evicts_its_own_least_recently_used_only() -> None:
    weights = {"a": 1.0, "b": 1.0}
    live = ["b/1", "a/1", "a/2", "b/2", "a/3", "a/4"]  # least recently used first
    assert evictions(live, "a", 1, 8, weights) == ["a/1"]
    assert evictions(live, "a", 2, 8, weights) == ["a/1", "a/2"]
    assert evictions(live, "b", 1, 8, weights) == []
    assert evictions(live, "b", 2, 8, weights) == []


def test_a_tenant_within_its_share_takes_room_from_one_over_its_share_only() -> None:
    # b holds 5 of 8 (it had the worker alone before a joined): a's new session takes b's.
    live = ["b/1", "b/2", "a/1", "b/3", "b/4", "b/5", "a/2", "a/3"]
    assert evictions(live, "a", 1, 8, {"a": 1.0, "b": 1.0}) == ["b/1"]
    # Every tenant within its share and the worker full: nobody else's session is taken.
    crowded = ["a/1", "b/1", "c/1"]
    assert evictions(crowded, "d", 1, 2, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}) == []


def test_more_forks_than_a_share_holds_have_no_room() -> None:
    assert evictions([], "a", 5, 8, {"a": 1.0, "b": 1.0}) is None
    assert evictions([], "a", 4, 8, {"a": 1.0, "b": 1.0}) == []
