"""Static topics' queue mappings: the rules a mapping keeps, lookups, remaps, rebalancing."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from capstan.common.queue_mapping import (
    OPEN,
    MappingError,
    QueueMapping,
    balanced_moves,
    begin_move,
    drop_read_items,
    finish_move,
    new_mapping,
    physical_queue_count,
    remap,
    retire_group,
)


def test_a_new_static_topic_spreads_its_logic_queues_round_robin_over_the_groups() -> None:
    m = new_mapping("Orders", 5, ["a", "b"])
    assert m.epoch == 1 and m.total_queues == 5
    # A logic queue keeps its id as its physical queue on whichever group holds it.
    assert [(m.leader(q).group, m.leader(q).queue_id) for q in range(5)] == [
        ("a", 0),
        ("b", 1),
        ("a", 2),
        ("b", 3),
        ("a", 4),
    ]
    assert m.led_by("a") == [0, 2, 4] and m.led_by("b") == [1, 3]
    assert physical_queue_count(m, "a") == 5 and physical_queue_count(m, "c") == 0
    assert m.logic_queue_of("b", 3) == 3 and m.logic_queue_of("b", 2) is None


def test_a_remap_continues_the_logic_offsets_where_the_old_item_stopped() -> None:
    m = new_mapping("Orders", 2, ["a"])
    moved = remap(m, 1, "b", old_end=40, new_start=0)
    assert moved.epoch == 2
    old, new = moved.items(1)
    assert (old.group, old.queue_id, old.end_offset, old.logic_end) == ("a", 1, 40, 40)
    assert (new.group, new.queue_id, new.logic_offset, new.start_offset) == ("b", 1, 40, 0)
    assert new.is_open and new.gen == old.gen + 1
    # Reads of older offsets go to the old item, newer ones to the new.
    assert moved.item_at(1, 39) == old and old.physical(39) == 39
    assert moved.item_at(1, 40) == new and new.physical(57) == 17
    assert new.logic(17) == 57
    # Logic queue 0 did not move.
    assert moved.items(0) == m.items(0)


def test_a_second_move_and_a_move_back_keep_offsets_continuous() -> None:
    m = new_mapping("Orders", 1, ["a"])
    m = remap(m, 0, "b", old_end=10, new_start=0)
    m = remap(m, 0, "a", old_end=15, new_start=10, to_queue_id=0)  # back onto its old queue
    a1, b, a2 = m.items(0)
    assert (a1.logic_offset, b.logic_offset, a2.logic_offset) == (0, 10, 25)
    assert a2.physical(25) == 10 and a2.queue_id == 0
    assert [m.item_at(0, off).group for off in (0, 9, 10, 24, 25, 1000)] == [
        "a",
        "a",
        "b",
        "b",
        "a",
        "a",
    ]
    assert m.hosted_by("a") == {0: [a1, a2]}


def test_remapping_to_the_leading_group_changes_nothing() -> None:
    m = new_mapping("Orders", 2, ["a", "b"])
    assert remap(m, 0, "a", old_end=99, new_start=0) is m


def test_an_item_closed_empty_is_dropped() -> None:
    m = remap(new_mapping("Orders", 1, ["a"]), 0, "b", old_end=0, new_start=0)
    (only,) = m.items(0)
    assert (only.group, only.logic_offset, only.gen) == ("b", 0, 1)


def test_a_remap_cannot_close_an_item_before_its_start() -> None:
    m = remap(new_mapping("Orders", 1, ["a"]), 0, "b", old_end=10, new_start=5)
    with pytest.raises(MappingError, match="logic queue 0: cannot close its item at offset 4"):
        remap(m, 0, "c", old_end=4, new_start=0)


def test_a_mapping_survives_json_unchanged() -> None:
    m = remap(new_mapping("Orders", 3, ["a", "b"]), 2, "c", old_end=7, new_start=3)
    again = QueueMapping.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again == m


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(epoch=0), "epoch must be an integer of at least 1"),
        (lambda d: d.update(queues=[]), "has 0 logic queues"),
        (lambda d: d["queues"][0].clear(), "logic queue 0: has no item"),
        (lambda d: d["queues"][1][0].update(endOffset=5), "the last item must be open"),
        (lambda d: d["queues"][1][0].update(queueId=0, group="a"), "already belongs to logic"),
        (lambda d: d["queues"][0][0].update(gen="1"), "gen must be an integer"),
        (lambda d: d["queues"][0][0].update(colour="red"), "unknown key 'colour'"),
        (lambda d: d["queues"][0][0].pop("group"), "group is missing"),
        (lambda d: d["queues"][0][0].update(group=""), "group must be a non-empty string"),
        (lambda d: d["queues"][0][0].update(queueId=5000), "queue_id 5000 is not 0..1023"),
        (lambda d: d["queues"][0][0].update(logicOffset=-5), "must not be negative"),
        (lambda d: d.pop("topic"), "topic is missing"),
        (lambda d: d.update(queues="x"), "queues must be a list"),
    ],
)
def test_a_broken_mapping_is_refused_naming_what_is_wrong(edit, message) -> None:  # type: ignore[no-untyped-def]
    d = new_mapping("Orders", 2, ["a", "b"]).to_dict()
    edit(d)
    with pytest.raises(MappingError, match=message):
        QueueMapping.from_dict(d)


def test_items_of_a_queue_must_continue_and_rise() -> None:
    d = remap(new_mapping("Orders", 1, ["a"]), 0, "b", old_end=10, new_start=0).to_dict()
    gap = json.loads(json.dumps(d))
    gap["queues"][0][1]["logicOffset"] = 11
    with pytest.raises(MappingError, match="starts at logic offset 11, but the one before it"):
        QueueMapping.from_dict(gap)
    gens = json.loads(json.dumps(d))
    gens["queues"][0][1]["gen"] = 0
    with pytest.raises(MappingError, match="item gens must rise"):
        QueueMapping.from_dict(gens)
    early = json.loads(json.dumps(d))
    early["queues"][0][0]["endOffset"] = OPEN
    with pytest.raises(MappingError, match="only the last item may be open"):
        QueueMapping.from_dict(early)


def test_one_physical_stretch_is_never_used_twice() -> None:
    m = remap(new_mapping("Orders", 1, ["a"]), 0, "b", old_end=10, new_start=0)
    with pytest.raises(MappingError, match="over the same offsets"):
        remap(m, 0, "a", old_end=4, new_start=9, to_queue_id=0)


def test_an_unknown_logic_queue_is_refused_naming_the_range() -> None:
    m = new_mapping("Orders", 4, ["a"])
    with pytest.raises(MappingError, match=r"has no logic queue 4 \(0\.\.3\)"):
        m.leader(4)


def test_a_new_mapping_needs_distinct_groups() -> None:
    with pytest.raises(MappingError, match="at least one broker group"):
        new_mapping("Orders", 4, [])
    with pytest.raises(MappingError, match="named twice"):
        new_mapping("Orders", 4, ["a", "a"])


def test_items_whose_messages_retention_removed_leave_the_mapping() -> None:
    m = new_mapping("Orders", 2, ["a"])
    m = remap(m, 0, "b", old_end=10, new_start=0)
    m = remap(m, 0, "c", old_end=5, new_start=0)
    assert drop_read_items(m, "a", 0, 9) is m  # one message of the item is still kept
    dropped = drop_read_items(m, "a", 0, 10)
    assert [i.group for i in dropped.items(0)] == ["b", "c"] and dropped.epoch == m.epoch + 1
    # The middle item goes only after the one before it: offsets stay continuous.
    assert drop_read_items(m, "b", 0, 5) is m
    # An open item stays, whatever the offset.
    assert drop_read_items(m, "a", 1, 10**9) is m


@pytest.mark.parametrize("total", [1, 4, 7, 16])
def test_balanced_moves_spread_writes_evenly_moving_as_few_queues_as_possible(total: int) -> None:
    for before, after in itertools.product(
        (["a"], ["a", "b"], ["a", "b", "c"]), (["a", "b"], ["b", "c"], ["d"], ["a", "b", "c", "d"])
    ):
        m = new_mapping("Orders", total, before)
        moves = balanced_moves(m, after)
        for q, to in moves:
            m = remap(m, q, to, old_end=3, new_start=0)
        counts = [len(m.led_by(g)) for g in after]
        assert sum(counts) == total and max(counts) - min(counts) <= 1, (before, after, counts)
        # Only queues that had to move did: those off the named groups or over a share.
        staying = [g for g in before if g in after]
        must_leave = sum(
            1
            for q in range(total)
            if new_mapping("Orders", total, before).leader(q).group not in after
        )
        assert len(moves) >= must_leave
        assert len(moves) <= must_leave + total // max(len(staying), 1)
        assert balanced_moves(m, after) == []


def test_random_remaps_always_keep_every_logic_offset_on_exactly_one_item() -> None:
    rng = random.Random(7)
    groups = ["a", "b", "c", "d"]
    m = new_mapping("Orders", 3, groups[:2])
    written = [0, 0, 0]  # logic offsets reached per queue
    ends: dict[tuple[str, int], int] = {}  # physical offsets reached per physical queue
    for _ in range(200):
        q = rng.randrange(3)
        leader = m.leader(q)
        key = (leader.group, leader.queue_id)
        grow = rng.randrange(0, 5)
        ends[key] = leader.physical(written[q]) + grow
        written[q] += grow
        to = rng.choice(groups)
        to_queue = m.logic_queue_of(to, q) is not None and rng.random() < 0.5
        target = q if to_queue else physical_queue_count(m, to)
        if m.logic_queue_of(to, target) not in (None, q):
            target = physical_queue_count(m, to)
        m = remap(m, q, to, ends[key], ends.get((to, target), 0), to_queue_id=target)
        for off in range(written[q]):
            holders = [i for i in m.items(q) if i.holds(off)]
            assert len(holders) <= 1
            assert m.item_at(q, off).holds(off) or off < m.items(q)[0].logic_offset


def test_a_move_in_two_steps_stops_writes_then_continues_the_offsets() -> None:
    m = new_mapping("Orders", 2, ["a", "b"])
    begun = begin_move(m, 0, "b")
    assert begun.epoch == 2 and begun.moving() == [0]
    sealed, pending = begun.items(0)
    assert sealed.is_sealing and pending.is_pending and pending.group == "b"
    # Nobody takes the queue's writes while it moves; reads still find the sealed item.
    assert begun.led_by("a") == [] and begun.led_by("b") == [1]
    assert begun.item_at(0, 7) == sealed
    assert begin_move(begun, 0, "b") is begun  # asked again: nothing new
    with pytest.raises(MappingError, match="is moving to group 'b' already"):
        begin_move(begun, 0, "c")
    again = QueueMapping.from_dict(json.loads(json.dumps(begun.to_dict())))
    assert again == begun
    done = finish_move(begun, 0, old_end=12, new_start=3)
    assert done.epoch == 3 and done.moving() == []
    old, new = done.items(0)
    assert (old.end_offset, new.logic_offset, new.start_offset) == (12, 12, 3)
    assert done.led_by("b") == [0, 1] and new.physical(12) == 3
    with pytest.raises(MappingError, match="is not moving"):
        finish_move(done, 0, 12, 3)
    # A queue that never held a message moves without leaving an item behind.
    empty = finish_move(begin_move(m, 1, "a"), 1, old_end=0, new_start=0)
    assert [i.group for i in empty.items(1)] == ["a"]


def test_a_sealed_item_must_be_followed_by_a_pending_one() -> None:
    d = begin_move(new_mapping("Orders", 1, ["a"]), 0, "b").to_dict()
    d["queues"][0][1].update(logicOffset=0, startOffset=0)
    with pytest.raises(MappingError, match="a sealed item must be followed by a pending one"):
        QueueMapping.from_dict(d)
    d = new_mapping("Orders", 1, ["a"]).to_dict()
    d["queues"][0][0].update(logicOffset=-1)
    with pytest.raises(MappingError, match="only the last item may be pending"):
        QueueMapping.from_dict(d)


def test_a_drained_group_is_retired_whole_and_never_while_it_still_matters() -> None:
    m = new_mapping("Orders", 2, ["a"])
    m = remap(m, 0, "b", old_end=5, new_start=0)
    with pytest.raises(MappingError, match="logic queue 1 takes its writes on group 'a'"):
        retire_group(m, "a")
    m = remap(m, 1, "b", old_end=3, new_start=0)
    retired = retire_group(m, "a")
    assert retired.groups() == ["b"] and retired.epoch == m.epoch + 1
    # Each queue's logic offsets go on from its first item left.
    assert [retired.items(q)[0].logic_offset for q in (0, 1)] == [5, 3]
    assert retire_group(retired, "a") is retired and retire_group(m, "c") is m
    # An item between other groups' items is still needed by readers of what follows it.
    back = remap(remap(m, 0, "a", old_end=2, new_start=5), 0, "b", old_end=6, new_start=2)
    with pytest.raises(MappingError, match="an item on group 'a' after items of other groups"):
        retire_group(back, "a")
