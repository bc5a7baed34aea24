"""A Topic resource wins over the broker group, and shrinks its queues in two phases."""

from __future__ import annotations

from dataclasses import replace

from capstan.operator.topic_sync import (
    TopicAction,
    TopicShape,
    next_topic_step,
    unconsumed_queues,
)

EIGHT = TopicShape(8, 8, 6, "NORMAL")
FOUR = replace(EIGHT, read_queues=4, write_queues=4)


def test_missing_is_created_and_matching_is_left_alone() -> None:
    assert next_topic_step(EIGHT, None, {}, {}).action is TopicAction.CREATE
    assert next_topic_step(EIGHT, EIGHT, {}, {}).action is TopicAction.IN_SYNC


def test_drift_is_repaired_and_named() -> None:
    step = next_topic_step(EIGHT, replace(EIGHT, perm=4, attributes={"x": "1"}), {}, {})
    assert step.action is TopicAction.UPDATE and step.shape == EIGHT
    assert step.drift == ("perm", "attributes")


def test_growing_is_one_update() -> None:
    step = next_topic_step(replace(EIGHT, read_queues=16, write_queues=16), EIGHT, {}, {})
    assert step.action is TopicAction.UPDATE and step.shape is not None
    assert (step.shape.read_queues, step.shape.write_queues) == (16, 16)


def test_shrinking_writes_first_then_reads_once_the_removed_queues_are_consumed() -> None:
    ends = dict.fromkeys(range(8), 10)
    behind = {"G": dict.fromkeys(range(8), 10) | {6: 7}}
    one = next_topic_step(FOUR, EIGHT, ends, behind)
    assert one.action is TopicAction.UPDATE and one.phase == "write-queues"
    assert one.shape == replace(FOUR, read_queues=8)
    after_one = replace(FOUR, read_queues=8)
    waiting = next_topic_step(FOUR, after_one, ends, behind)
    assert waiting.action is TopicAction.WAIT and "queue(s) 6" in waiting.reason
    caught_up = {"G": dict.fromkeys(range(8), 10)}
    two = next_topic_step(FOUR, after_one, ends, caught_up)
    assert two.action is TopicAction.UPDATE and two.phase == "read-queues" and two.shape == FOUR


def test_unconsumed_counts_only_non_empty_queues_of_groups_that_consumed() -> None:
    ends = {4: 0, 5: 3, 6: 3}
    assert unconsumed_queues(range(4, 7), ends, {}) == []
    assert unconsumed_queues(range(4, 7), ends, {"A": {5: 3, 6: 1}, "B": {5: 3, 6: 3}}) == [6]
