"""Offset resets as GroupMembership keeps them for the watch streams: each bumps the
group's version, and a watcher gets every queue reset since the last one it saw, the later
reset of a queue winning."""

from __future__ import annotations

from capstan.broker.consumer_groups.membership import RESETS_KEPT, GroupMembership


def test_a_watcher_gets_the_resets_it_has_not_seen_with_the_latest_offset_per_queue() -> None:
    members = GroupMembership(expiry_s=30)
    assert members.resets_since("G", 0) == (0, [])
    version = members.version("G")
    first = members.announce_reset("G", [("T", 0, 5), ("T", 1, 7)])
    assert members.version("G") == version + 1  # so waiting watch streams wake
    second = members.announce_reset("G", [("T", 1, 2), ("U", 0, 9)])
    assert (first, second) == (1, 2)
    assert members.resets_since("G", 0) == (2, [("T", 0, 5), ("T", 1, 2), ("U", 0, 9)])
    assert members.resets_since("G", first) == (2, [("T", 1, 2), ("U", 0, 9)])
    assert members.resets_since("G", second) == (2, [])
    assert members.resets_since("other", 0) == (0, [])


def test_only_the_latest_resets_are_kept() -> None:
    members = GroupMembership(expiry_s=30)
    for n in range(RESETS_KEPT + 5):
        members.announce_reset("G", [("T", n, n)])
    latest, offsets = members.resets_since("G", 0)
    assert latest == RESETS_KEPT + 5
    assert [q for _, q, _ in offsets] == list(range(5, RESETS_KEPT + 5))
