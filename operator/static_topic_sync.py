"""Bringing a static Topic (`spec.static: true`) to what its resource says: the decision,
and one round that carries it out through the controllers' admin API.

A static topic's mapping is the controller's (capstan/common/queue_mapping.py). The
resource names the logic queue count (`spec.queues`, fixed once the topic exists) and the
broker groups that serve it (`spec.brokerGroups`). Naming a new group spreads the logic
queues' writes over it; leaving a group out drains it: its queues move to the others.
Either is done one logic queue at a time (`balanced_moves`, as few moves as possible), each
move the controller's two-step remap, so the status can say how far it got and a crash
leaves at most one queue in the middle of a move, which the controller finishes by itself.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, Protocol

from capstan.common.queue_mapping import MappingError, QueueMapping, balanced_moves
from capstan.operator.topic_sync import TopicShape, drifted_fields


class StaticAction(Enum):
    CREATE = "create"
    MOVE = "move"
    """Remap logic queue `queue` to `group`."""
    WAIT = "wait"
    """A queue is between the two steps of a move; the controller finishes it."""
    IN_SYNC = "in_sync"
    REFUSE = "refuse"
    """The resource asks for what a static topic cannot do; `reason` says what."""


@dataclass(frozen=True)
class StaticStep:
    action: StaticAction
    reason: str
    queue: int = -1
    group: str = ""
    remaining: int = 0
    """Moves still to make after this one."""


def next_static_step(
    mapping: QueueMapping | None, groups: Sequence[str], queues: int
) -> StaticStep:
    """The next step for a static topic whose mapping is `mapping` (None: not made yet),
    asked to have `queues` logic queues spread over `groups`."""
    names = ", ".join(groups)
    if mapping is None:
        return StaticStep(StaticAction.CREATE, f"creating {queues} logic queues on {names}")
    if mapping.total_queues != queues:
        return StaticStep(
            StaticAction.REFUSE,
            f"static topic {mapping.topic!r} has {mapping.total_queues} logic queues; a "
            f"static topic's logic queue count cannot change (spec.queues is {queues})",
        )
    moving = mapping.moving()
    if moving:
        q = moving[0]
        return StaticStep(
            StaticAction.WAIT,
            f"logic queue {q} is moving to group {mapping.leader(q).group!r}; the "
            "controller finishes the move",
        )
    try:
        moves = balanced_moves(mapping, groups)
    except MappingError as exc:
        return StaticStep(StaticAction.REFUSE, str(exc))
    if not moves:
        return StaticStep(StaticAction.IN_SYNC, f"{queues} logic queues on {names}")
    q, to = moves[0]
    return StaticStep(
        StaticAction.MOVE,
        f"moving logic queue {q} from group {mapping.leader(q).group!r} to group {to!r} "
        f"({len(moves) - 1} more after it)",
        queue=q,
        group=to,
        remaining=len(moves) - 1,
    )


def mapping_status(mapping: QueueMapping, remaining: int) -> dict[str, Any]:
    """`status.static`: the mapping's epoch, each logic queue's leading group, and the
    moves still to make."""
    return {
        "epoch": mapping.epoch,
        "movesRemaining": remaining,
        "queues": [
            {
                "queue": q,
                "group": items[-1].group,
                "items": len(items),
                "moving": items[-1].is_pending,
            }
            for q, items in enumerate(mapping.queues)
        ],
    }


class StaticTopicAdmin(Protocol):
    """What a round needs of the controllers (controller_admin.py)."""

    async def mapping(self, topic: str) -> QueueMapping | None: ...

    async def create_static(
        self, topic: str, queues: int, shape: TopicShape, groups: Sequence[str]
    ) -> QueueMapping: ...

    async def remap(self, topic: str, queue: int, group: str) -> QueueMapping: ...


async def sync_static_round(
    admin: StaticTopicAdmin,
    topic: str,
    queues: int,
    shape: TopicShape,
    groups: Sequence[str],
    done: Callable[[str, str, QueueMapping, StaticStep], Awaitable[None]],
    budget_s: float,
) -> tuple[QueueMapping | None, StaticStep]:
    """Make the static topic if it is missing, then move logic queues one at a time for
    up to `budget_s`; `done(reason, message, mapping, next_step)` is told of each step
    made (an Event, the status). The mapping afterwards and the step that comes next."""
    mapping = await admin.mapping(topic)
    step = next_static_step(mapping, groups, queues)
    if step.action is StaticAction.CREATE:
        mapping = await admin.create_static(topic, queues, shape, groups)
        made = step
        step = next_static_step(mapping, groups, queues)
        await done("StaticTopicCreated", made.reason, mapping, step)
    started = time.monotonic()
    while step.action is StaticAction.MOVE and time.monotonic() - started < budget_s:
        mapping = await admin.remap(topic, step.queue, step.group)
        made = step
        step = next_static_step(mapping, groups, queues)
        moved = made.reason.replace("moving", "moved", 1)
        await done("LogicQueueMoved", moved, mapping, step)
    return mapping, step


class GroupTopicAdmin(Protocol):
    """What a settings repair needs of one broker group (broker_admin.py)."""

    async def topic(self, name: str) -> tuple[TopicShape, dict[int, int]] | None: ...

    async def put_topic(self, name: str, shape: TopicShape, create: bool) -> None: ...


async def repair_static_settings(
    admins: Mapping[str, GroupTopicAdmin], topic: str, desired: TopicShape
) -> dict[str, tuple[str, ...]]:
    """The static topic's settings (type, permission, attributes) on each group that holds
    it put back to `desired` where they drifted; its queue counts are left as each group
    holds them (the mapping's, which the brokers keep). Per group, the fields that differed.
    A group that lacks the topic is left to the controller, which hands it on with the
    mapping."""
    drift: dict[str, tuple[str, ...]] = {}
    for group, admin in admins.items():
        found = await admin.topic(topic)
        if found is None:
            continue
        actual = found[0]
        wanted = replace(desired, read_queues=actual.read_queues, write_queues=actual.write_queues)
        fields = drifted_fields(wanted, actual)
        if fields:
            await admin.put_topic(topic, wanted, create=False)
            drift[group] = fields
    return drift
