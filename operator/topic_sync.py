"""Bringing a topic on one broker group to what its Topic resource says.

The resource wins (one-way sync): a topic missing on the group is created, one whose
settings drifted is updated back, and the drift is named so the status can report it.

Fewer queues is done in two phases, as RocketMQ's operators advise, so no message is
stranded in a queue nobody reads: first the write queues shrink (producers stop choosing
the removed queues, consumers still read them); the read queues follow only once every
consumer group that consumed the topic has consumed the removed queues to their end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum


@dataclass(frozen=True)
class TopicShape:
    """The settings of a topic that the resource owns."""

    read_queues: int
    write_queues: int
    perm: int
    message_type: str
    attributes: Mapping[str, str] = field(default_factory=dict)


class TopicAction(Enum):
    IN_SYNC = "in_sync"
    CREATE = "create"
    UPDATE = "update"
    """Write `shape` to the broker group (repairing drift, growing, or a shrink phase)."""
    WAIT = "wait"


@dataclass(frozen=True)
class TopicStep:
    action: TopicAction
    shape: TopicShape | None = None
    reason: str = ""
    phase: str = ""
    """During a shrink: "write-queues" or "read-queues" (shown in status)."""
    drift: tuple[str, ...] = ()
    """The fields that differed from the resource, repaired by this step."""


def drifted_fields(desired: TopicShape, actual: TopicShape) -> tuple[str, ...]:
    return tuple(
        name
        for name in ("read_queues", "write_queues", "perm", "message_type", "attributes")
        if getattr(desired, name) != getattr(actual, name)
    )


def unconsumed_queues(
    removed: range,
    queue_ends: Mapping[int, int],
    committed: Mapping[str, Mapping[int, int]],
) -> list[int]:
    """Which of the `removed` queue ids still hold messages some group has not consumed:
    a queue counts as consumed by a group whose committed offset reached its end, and by
    every group once it is empty. Groups that never committed on the topic do not hold it."""
    held = []
    for qid in removed:
        end = queue_ends.get(qid, 0)
        if end == 0:
            continue
        if any(offsets.get(qid, 0) < end for offsets in committed.values()):
            held.append(qid)
    return held


def next_topic_step(
    desired: TopicShape,
    actual: TopicShape | None,
    queue_ends: Mapping[int, int],
    committed: Mapping[str, Mapping[int, int]],
) -> TopicStep:
    """What to write to the broker group next; `actual` is None when it lacks the topic."""
    if actual is None:
        return TopicStep(TopicAction.CREATE, desired, "creating the topic")
    drift = drifted_fields(desired, actual)
    if not drift:
        return TopicStep(TopicAction.IN_SYNC, reason="the topic matches the resource")
    if desired.read_queues >= actual.read_queues:
        # Growing, or other settings: one write, with write queues never ahead of reads
        # being shrunk (those are the second phase below).
        return TopicStep(TopicAction.UPDATE, desired, "updating the topic", drift=drift)
    # Fewer read queues. Phase one: everything but the read queues (the write queues shrink).
    interim = replace(desired, read_queues=actual.read_queues)
    if drifted_fields(interim, actual):
        return TopicStep(
            TopicAction.UPDATE,
            interim,
            f"write queues {actual.write_queues} -> {desired.write_queues}; read queues "
            f"stay {actual.read_queues} until the removed queues are consumed",
            phase="write-queues",
            drift=drift,
        )
    removed = range(desired.read_queues, actual.read_queues)
    held = unconsumed_queues(removed, queue_ends, committed)
    if held:
        return TopicStep(
            TopicAction.WAIT,
            reason=f"read queues stay {actual.read_queues} until queue(s) "
            f"{', '.join(map(str, held))} are consumed",
            phase="read-queues",
        )
    return TopicStep(
        TopicAction.UPDATE,
        desired,
        f"read queues {actual.read_queues} -> {desired.read_queues}: the removed queues "
        "are consumed",
        phase="read-queues",
        drift=drift,
    )
