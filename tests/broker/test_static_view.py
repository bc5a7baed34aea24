"""What a static topic's mapping means on one group: offsets translated between the logic
queue and the group's physical queue, and where FIFO order holds a consumer group."""

from __future__ import annotations

from capstan.broker.static_topics import OrderCheck, OrderGate, StaticView
from capstan.common.queue_mapping import new_mapping, remap

# Logic queue 0: 10 messages on group-a, then 5 on group-b, then back to group-a.
THERE_AND_BACK = remap(
    remap(new_mapping("T", 2, ["group-a"]), 0, "group-b", old_end=10, new_start=0),
    0,
    "group-a",
    old_end=5,
    new_start=10,
)


def test_logic_offsets_map_to_the_item_that_holds_them_and_skip_other_groups_stretches():
    a = StaticView.of(THERE_AND_BACK, "group-a")
    assert [a.physical_offset(0, n) for n in (0, 9, 10, 14, 15, 20)] == [0, 9, 10, 10, 10, 15]
    assert [a.logic_offset(0, p) for p in (0, 9, 10, 12)] == [0, 9, 15, 17]
    b = StaticView.of(THERE_AND_BACK, "group-b")
    # Before group-b's item: its start; after it (the queue went on elsewhere): its end.
    assert [b.physical_offset(0, n) for n in (0, 10, 14, 15, 99)] == [0, 0, 4, 5, 5]
    assert [b.logic_offset(0, p) for p in (0, 4, 5)] == [10, 14, 15]
    # The mapping answers the same for any group (what the Spark jobs use).
    assert THERE_AND_BACK.physical_offset("group-a", 0, 14) == 10
    assert THERE_AND_BACK.logic_offset("group-b", 0, 4) == 14
    assert THERE_AND_BACK.held_elsewhere("group-a", 0) == [(10, 15)]
    assert THERE_AND_BACK.held_elsewhere("group-b", 0) == []
    # A queue the group does not hold keeps the client's offsets.
    assert b.physical_offset(1, 7) == 7 and b.logic_offset(1, 7) == 7


class _Static:
    def __init__(self, view: StaticView) -> None:
        self._view = view

    def view(self, topic: str) -> StaticView | None:
        return self._view if topic == "T" else None


def test_a_fifo_group_is_held_at_each_item_that_continues_another_groups_until_it_passed():
    a = StaticView.of(THERE_AND_BACK, "group-a")
    first, second, _ = THERE_AND_BACK.items(0)
    assert a.gates == {0: ((10, second),)}  # the return to group-a follows group-b's item
    assert StaticView.of(THERE_AND_BACK, "group-b").gates == {0: ((0, first),)}
    gate = OrderGate(_Static(a))  # type: ignore[arg-type]
    assert gate.stop_at("readers", "T", 0) == 10
    assert gate.stop_at("readers", "T", 1) is None and gate.stop_at("readers", "U", 0) is None
    assert gate.wanted() == []  # nothing asked until a read reaches the hold
    gate.blocked("readers", "T", 0)
    check = OrderCheck("readers", "T", 0, second)
    assert gate.wanted() == [check]
    gate.passed(check)
    assert gate.stop_at("readers", "T", 0) is None and gate.wanted() == []
    assert gate.stop_at("others", "T", 0) == 10  # each consumer group passes on its own
