"""Which broker pod evictions a drain may make: never the master of several replicas
before it hands over, never one that leaves fewer than minInSyncReplicas in sync; a
lagging slave (out of the SyncStateSet) or a group with nothing leading costs nothing."""

from __future__ import annotations

import pytest

from capstan.operator.drain_guard import eviction_refusal
from capstan.operator.roller import GroupView

PODS = frozenset({"g-0", "g-1", "g-2"})


def group(master: str | None, in_sync: set[str]) -> GroupView:
    return GroupView(master, 4, frozenset(in_sync), PODS)


@pytest.mark.parametrize(
    "pod, view, min_in_sync, refused",
    [
        # The master: refused whatever the SyncStateSet, until it hands over.
        ("g-0", group("g-0", {"g-0", "g-1", "g-2"}), 1, "g-0 is the master"),
        # A slave in sync while the other slave lags: the master alone would remain.
        ("g-1", group("g-0", {"g-0", "g-1"}), 2, "would leave 1 of min 2 brokers in sync"),
        # Enough stay in sync.
        ("g-1", group("g-0", {"g-0", "g-1", "g-2"}), 2, None),
        # The lagging slave holds nothing the group counts on.
        ("g-2", group("g-0", {"g-0", "g-1"}), 2, None),
        # Nothing leads: no acknowledged write to lose; the PDB still counts pods.
        ("g-0", group(None, set()), 2, None),
    ],
)
def test_an_eviction_is_refused_exactly_when_it_would_cost_the_group(
    pod: str, view: GroupView, min_in_sync: int, refused: str | None
) -> None:
    said = eviction_refusal(pod, view, 3, min_in_sync)
    if refused is None:
        assert said is None
    else:
        assert said is not None and refused in said


def test_the_only_replica_may_go_there_is_no_one_to_hand_over_to() -> None:
    view = GroupView("g-0", 1, frozenset({"g-0"}), frozenset({"g-0"}))
    assert eviction_refusal("g-0", view, 1, 1) is None
