"""Static topics: logic queues mapped onto the physical queues of broker groups.

A static topic has a fixed number of *logic* queues, whichever broker groups serve it
(RocketMQ 5's static topics, `TopicQueueMappingDetail`). Clients see only logic queue ids
and logic offsets; each broker translates them to a physical queue of its own store.

A logic queue is a list of items, oldest first. Each item is one stretch of the queue kept
in one physical queue of one group: the messages from logic offset `logic_offset` on,
stored from physical offset `start_offset` on, up to physical offset `end_offset`
(exclusive). The last item is open (`end_offset` is OPEN): it takes the logic queue's
writes, and its group *leads* the queue. Remapping a logic queue closes the open item at
the physical offset its queue had reached and opens a new one on another group, starting
at the logic offset right after: the logic offsets of a queue stay continuous across any
number of moves, and older offsets are read from the item that holds them.

A move is made in two steps, each a mapping of its own, so a crash between them leaves one
or the other (`begin_move`, `finish_move`). The first seals the open item (its `end_offset`
is SEALING: it takes no more writes, and its end is wherever its queue stopped) and adds a
pending item on the new group (`logic_offset` and `start_offset` are PENDING): while a
queue moves, no group takes its writes. The second fills in the sealed item's end and the
pending item's start, from the offsets the two groups report; the new item is then open.

The whole mapping has an epoch that rises with every change, so a broker that is handed an
older mapping than the one it holds keeps its own. Everything here is pure: the controller
decides with these functions and the brokers look up with them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from capstan.common.errors import ConfigError

OPEN = -1
"""`end_offset` of the item that takes a logic queue's writes."""

SEALING = -2
"""`end_offset` of an item whose queue is moving: no more writes, its end not yet fixed."""

PENDING = -1
"""`logic_offset` and `start_offset` of the item a queue is moving to, until it is fixed."""

MAX_LOGIC_QUEUES = 1024
"""The most logic queues a static topic may have (as many as a topic's queues)."""

MAX_PHYSICAL_QUEUE_ID = 1023


class MappingError(ConfigError):
    """A mapping, or a change to one, that breaks the rules above; says which queue."""


@dataclass(frozen=True, slots=True)
class MappingItem:
    """One stretch of a logic queue, kept in physical queue `queue_id` of group `group`."""

    gen: int
    """Rises by one with each item of the queue (RocketMQ's `gen`)."""
    group: str
    queue_id: int
    logic_offset: int
    """The logic offset of the item's first message."""
    start_offset: int
    """The physical offset, in `queue_id` of `group`, of the item's first message."""
    end_offset: int = OPEN
    """The physical offset after the item's last message; OPEN while it takes writes."""

    @property
    def is_open(self) -> bool:
        return self.end_offset == OPEN

    @property
    def is_sealing(self) -> bool:
        return self.end_offset == SEALING

    @property
    def is_pending(self) -> bool:
        return self.logic_offset == PENDING

    @property
    def takes_writes(self) -> bool:
        return self.is_open and not self.is_pending

    @property
    def logic_end(self) -> int | None:
        """The logic offset after the item's last message; None while it is open (or its
        end is not fixed yet)."""
        if self.is_open or self.is_sealing:
            return None
        return self.logic_offset + self.end_offset - self.start_offset

    def logic(self, physical_offset: int) -> int:
        """The logic offset of the message at `physical_offset` of this item's queue."""
        return self.logic_offset + physical_offset - self.start_offset

    def physical(self, logic_offset: int) -> int:
        """The physical offset, in this item's queue, of logic offset `logic_offset`."""
        return self.start_offset + logic_offset - self.logic_offset

    def holds(self, logic_offset: int) -> bool:
        """Whether logic offset `logic_offset` lies in this item's stretch."""
        end = self.logic_end
        return logic_offset >= self.logic_offset and (end is None or logic_offset < end)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gen": self.gen,
            "group": self.group,
            "queueId": self.queue_id,
            "logicOffset": self.logic_offset,
            "startOffset": self.start_offset,
            "endOffset": self.end_offset,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], owner: str) -> MappingItem:
        if not isinstance(data, Mapping):
            raise MappingError(f"{owner}: an item must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_ITEM_KEYS))
        if unknown:
            raise MappingError(f"{owner}: unknown key {unknown[0]!r}")
        missing = [k for k in _ITEM_KEYS if k not in data and k != "endOffset"]
        if missing:
            raise MappingError(f"{owner}: {missing[0]} is missing")
        return cls(
            gen=_int(owner, "gen", data["gen"]),
            group=_group(owner, data["group"]),
            queue_id=_int(owner, "queueId", data["queueId"]),
            logic_offset=_int(owner, "logicOffset", data["logicOffset"]),
            start_offset=_int(owner, "startOffset", data["startOffset"]),
            end_offset=_int(owner, "endOffset", data.get("endOffset", OPEN)),
        )


_ITEM_KEYS = ("gen", "group", "queueId", "logicOffset", "startOffset", "endOffset")
_MAPPING_KEYS = ("topic", "epoch", "queues")


@dataclass(frozen=True)
class QueueMapping:
    """A static topic's mapping: for each logic queue (by id), its items, oldest first."""

    topic: str
    epoch: int
    queues: tuple[tuple[MappingItem, ...], ...]

    def __post_init__(self) -> None:
        check(self)

    @property
    def total_queues(self) -> int:
        return len(self.queues)

    def items(self, logic_queue: int) -> tuple[MappingItem, ...]:
        if not 0 <= logic_queue < len(self.queues):
            raise MappingError(
                f"static topic {self.topic!r} has no logic queue {logic_queue} "
                f"(0..{len(self.queues) - 1})"
            )
        return self.queues[logic_queue]

    def leader(self, logic_queue: int) -> MappingItem:
        """The open item of a logic queue: where its writes go."""
        return self.items(logic_queue)[-1]

    def item_at(self, logic_queue: int, logic_offset: int) -> MappingItem:
        """The item that holds `logic_offset`: the first item for an offset before every
        item (its messages are gone), the open one for an offset past the end."""
        items = self.items(logic_queue)
        for item in reversed(items):
            if not item.is_pending and logic_offset >= item.logic_offset:
                return item
        return items[0]

    def led_by(self, group: str) -> list[int]:
        """The logic queues whose writes go to `group`, in id order (not a moving one)."""
        return [
            q
            for q, items in enumerate(self.queues)
            if items[-1].group == group and items[-1].takes_writes
        ]

    def fronted_by(self, group: str) -> list[int]:
        """The logic queues whose last item is on `group` (led there, or moving there)."""
        return [q for q, items in enumerate(self.queues) if items[-1].group == group]

    def moving(self) -> list[int]:
        """The logic queues between the two steps of a move."""
        return [q for q, items in enumerate(self.queues) if items[-1].is_pending]

    def hosted_by(self, group: str) -> dict[int, list[MappingItem]]:
        """For each logic queue with any item on `group`, those items."""
        found: dict[int, list[MappingItem]] = {}
        for q, items in enumerate(self.queues):
            mine = [i for i in items if i.group == group]
            if mine:
                found[q] = mine
        return found

    def logic_queue_of(self, group: str, queue_id: int) -> int | None:
        """The logic queue physical queue `queue_id` of `group` belongs to, if any."""
        for q, items in enumerate(self.queues):
            if any(i.group == group and i.queue_id == queue_id for i in items):
                return q
        return None

    def items_on(self, group: str, logic_queue: int) -> tuple[MappingItem, ...]:
        """The items of a logic queue kept on `group` that hold messages, oldest first."""
        return tuple(i for i in self.items(logic_queue) if i.group == group and not i.is_pending)

    def logic_offset(self, group: str, logic_queue: int, physical: int) -> int:
        """What physical offset `physical` of `group`'s queue is as a logic offset."""
        return logic_of(self.items_on(group, logic_queue), physical)

    def physical_offset(self, group: str, logic_queue: int, logic: int) -> int:
        """Where logic offset `logic` is read in `group`'s physical queue (`physical_of`)."""
        return physical_of(self.items_on(group, logic_queue), logic)

    def held_elsewhere(self, group: str, logic_queue: int) -> list[tuple[int, int]]:
        """The stretches [start, end) of logic offsets between `group`'s items of a logic
        queue, which other groups hold: a read of `group` skips them."""
        here = self.items_on(group, logic_queue)
        return [
            (end, after.logic_offset)
            for before, after in itertools.pairwise(here)
            if (end := before.logic_end) is not None and end < after.logic_offset
        ]

    def groups(self) -> list[str]:
        """Every group holding an item of the topic, in order of first appearance."""
        seen: dict[str, None] = {}
        for items in self.queues:
            for item in items:
                seen.setdefault(item.group)
        return list(seen)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "epoch": self.epoch,
            "queues": [[i.to_dict() for i in items] for items in self.queues],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QueueMapping:
        """The mapping a `to_dict` result describes; MappingError names what is wrong."""
        if not isinstance(data, Mapping):
            raise MappingError(f"a queue mapping must be an object, got {type(data).__name__}")
        owner = f"queue mapping of {data.get('topic')!r}"
        unknown = sorted(set(data) - set(_MAPPING_KEYS))
        if unknown:
            raise MappingError(f"{owner}: unknown key {unknown[0]!r}")
        for key in _MAPPING_KEYS:
            if key not in data:
                raise MappingError(f"{owner}: {key} is missing")
        topic = data["topic"]
        if not isinstance(topic, str) or not topic:
            raise MappingError(f"{owner}: topic must be a non-empty string")
        raw_queues = data["queues"]
        if not isinstance(raw_queues, list):
            raise MappingError(f"{owner}: queues must be a list of logic queues")
        queues = []
        for q, raw in enumerate(raw_queues):
            if not isinstance(raw, list):
                raise MappingError(f"{owner}: logic queue {q} must be a list of items")
            queues.append(
                tuple(
                    MappingItem.from_dict(item, f"{owner}, logic queue {q}, item {n}")
                    for n, item in enumerate(raw)
                )
            )
        return cls(topic, _int(owner, "epoch", data["epoch"]), tuple(queues))


def logic_of(here: Sequence[MappingItem], physical: int) -> int:
    """The logic offset of physical offset `physical` of a group's queue whose items of
    the logic queue are `here` (oldest first): through the newest item starting at or
    before it. With no items, the same offset."""
    if not here:
        return physical
    for item in reversed(here):
        if item.start_offset <= physical:
            return item.logic(physical)
    return here[0].logic(physical)


def physical_of(here: Sequence[MappingItem], logic: int) -> int:
    """Where logic offset `logic` is read in a group's queue whose items of the logic queue
    are `here`: in the item that holds it; for an offset before every item, or in a
    stretch another group holds, the start of the next item; past the last item (closed:
    the queue went on elsewhere), the physical offset after it."""
    if not here:
        return logic
    for item in here:
        if logic < item.logic_offset:
            return item.start_offset
        end = item.logic_end
        if end is None or logic < end:
            return item.physical(logic)
    return here[-1].end_offset


def check(mapping: QueueMapping) -> None:
    """Raise MappingError unless `mapping` keeps every rule of the module docstring."""
    owner = f"static topic {mapping.topic!r}"
    if not isinstance(mapping.topic, str) or not mapping.topic:
        raise MappingError("a static topic's name must be a non-empty string")
    if isinstance(mapping.epoch, bool) or not isinstance(mapping.epoch, int) or mapping.epoch < 1:
        raise MappingError(f"{owner}: epoch must be an integer of at least 1")
    if not 1 <= len(mapping.queues) <= MAX_LOGIC_QUEUES:
        raise MappingError(
            f"{owner}: has {len(mapping.queues)} logic queues; 1..{MAX_LOGIC_QUEUES} are allowed"
        )
    owners: dict[tuple[str, int], int] = {}
    for q, items in enumerate(mapping.queues):
        where = f"{owner}, logic queue {q}"
        if not items:
            raise MappingError(f"{where}: has no item")
        for n, item in enumerate(items):
            _check_item(f"{where}, item {n}", item, last=n == len(items) - 1)
            holder = owners.setdefault((item.group, item.queue_id), q)
            if holder != q:
                raise MappingError(
                    f"{where}: physical queue {item.queue_id} of group {item.group!r} "
                    f"already belongs to logic queue {holder}"
                )
        _check_sequence(where, items)


def _check_item(where: str, item: MappingItem, last: bool) -> None:
    for name in ("gen", "queue_id", "logic_offset", "start_offset", "end_offset"):
        value = getattr(item, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise MappingError(f"{where}: {name} must be an integer, got {value!r}")
    _group(where, item.group)
    if item.is_pending:
        if item.start_offset != PENDING or not last or not item.is_open:
            raise MappingError(
                f"{where}: only the last item may be pending, open, with both offsets -1"
            )
    elif item.logic_offset < 0 or item.start_offset < 0:
        raise MappingError(f"{where}: logic_offset and start_offset must not be negative")
    if item.gen < 0:
        raise MappingError(f"{where}: gen must not be negative")
    if not 0 <= item.queue_id <= MAX_PHYSICAL_QUEUE_ID:
        raise MappingError(f"{where}: queue_id {item.queue_id} is not 0..{MAX_PHYSICAL_QUEUE_ID}")
    if last and not item.is_open:
        raise MappingError(f"{where}: the last item must be open (it takes the writes)")
    if not last and item.is_open:
        raise MappingError(f"{where}: only the last item may be open")
    if item.end_offset < SEALING or (item.end_offset >= 0 and item.end_offset < item.start_offset):
        raise MappingError(f"{where}: end_offset {item.end_offset} lies before start_offset")


def _check_sequence(where: str, items: Sequence[MappingItem]) -> None:
    """Consecutive items: rising gens, logic offsets that continue, a sealing item only
    right before a pending one, and no physical stretch of one queue used twice."""
    reached: dict[tuple[str, int], int] = {}
    for before, after in itertools.pairwise(items):
        if after.gen <= before.gen:
            raise MappingError(f"{where}: item gens must rise ({before.gen}, then {after.gen})")
        if before.is_sealing != after.is_pending:
            raise MappingError(f"{where}: a sealed item must be followed by a pending one")
        if not after.is_pending and after.logic_offset != before.logic_end:
            raise MappingError(
                f"{where}: an item starts at logic offset {after.logic_offset}, but the one "
                f"before it ends at {before.logic_end}"
            )
    for item in items:
        if item.is_pending:
            continue
        key = (item.group, item.queue_id)
        if item.start_offset < reached.get(key, 0):
            raise MappingError(
                f"{where}: two items use physical queue {item.queue_id} of group "
                f"{item.group!r} over the same offsets"
            )
        reached[key] = item.end_offset if item.end_offset >= 0 else 1 << 62


def new_mapping(topic: str, total_queues: int, groups: Sequence[str]) -> QueueMapping:
    """A new static topic: logic queue q on group `groups[q % len(groups)]`, in that group's
    physical queue q (a logic queue keeps its id on every group that holds it, so a
    physical queue id names its logic queue), from offset 0; epoch 1."""
    if not groups:
        raise MappingError(f"static topic {topic!r} needs at least one broker group")
    if len(set(groups)) != len(groups):
        raise MappingError(f"static topic {topic!r}: a broker group is named twice")
    n = len(groups)
    return QueueMapping(
        topic,
        1,
        tuple((MappingItem(0, groups[q % n], q, 0, 0),) for q in range(total_queues)),
    )


def physical_queue_count(mapping: QueueMapping, group: str) -> int:
    """How many physical queues `group` needs for the topic: one past the highest it uses."""
    used = [i.queue_id for items in mapping.queues for i in items if i.group == group]
    return max(used) + 1 if used else 0


def begin_move(
    mapping: QueueMapping, logic_queue: int, to_group: str, to_queue_id: int | None = None
) -> QueueMapping:
    """The first step of moving `logic_queue`'s writes to `to_group`: its open item is
    sealed, and a pending item opens on physical queue `to_queue_id` of `to_group` (by
    default the logic queue's own id). Moving to the group that leads already, or again to
    the group a move is pending to, changes nothing."""
    leader = mapping.leader(logic_queue)
    if leader.group == to_group and (leader.takes_writes or leader.is_pending):
        return mapping
    where = f"static topic {mapping.topic!r}, logic queue {logic_queue}"
    if leader.is_pending:
        raise MappingError(f"{where}: is moving to group {leader.group!r} already")
    sealed = replace(leader, end_offset=SEALING)
    queue_id = logic_queue if to_queue_id is None else to_queue_id
    pending = MappingItem(leader.gen + 1, to_group, queue_id, PENDING, PENDING)
    return _with_queue(mapping, logic_queue, (*mapping.items(logic_queue)[:-1], sealed, pending))


def finish_move(
    mapping: QueueMapping, logic_queue: int, old_end: int, new_start: int
) -> QueueMapping:
    """The second step: the sealed item ends at physical offset `old_end` (where its queue
    stopped taking writes) and the pending one opens at physical offset `new_start` of its
    queue, at the logic offset after the sealed item. A sealed item that holds nothing is
    dropped."""
    items = mapping.items(logic_queue)
    where = f"static topic {mapping.topic!r}, logic queue {logic_queue}"
    if not items[-1].is_pending:
        raise MappingError(f"{where}: is not moving")
    sealed, pending = items[-2], items[-1]
    if old_end < sealed.start_offset:
        raise MappingError(
            f"{where}: cannot close its item at offset {old_end}, before its start "
            f"{sealed.start_offset}"
        )
    closed = replace(sealed, end_offset=old_end)
    opened = replace(pending, logic_offset=closed.logic(old_end), start_offset=new_start)
    kept = items[:-2] + ((closed,) if old_end > sealed.start_offset else ())
    return _with_queue(mapping, logic_queue, (*kept, opened))


def remap(
    mapping: QueueMapping,
    logic_queue: int,
    to_group: str,
    old_end: int,
    new_start: int,
    to_queue_id: int | None = None,
) -> QueueMapping:
    """Both steps of a move at once (one epoch up), for offsets known beforehand: the open
    item closes at physical offset `old_end`, and a new one opens at physical offset
    `new_start` of physical queue `to_queue_id` on `to_group` (by default the logic queue's
    own id), at the logic offset after the closed item. An item that closes empty is
    dropped; remapping to the leading group changes nothing."""
    begun = begin_move(mapping, logic_queue, to_group, to_queue_id)
    if begun is mapping:
        return mapping
    done = finish_move(begun, logic_queue, old_end, new_start)
    return QueueMapping(done.topic, mapping.epoch + 1, done.queues)


def _with_queue(
    mapping: QueueMapping, logic_queue: int, items: tuple[MappingItem, ...]
) -> QueueMapping:
    queues = list(mapping.queues)
    queues[logic_queue] = items
    return QueueMapping(mapping.topic, mapping.epoch + 1, tuple(queues))


def drop_read_items(
    mapping: QueueMapping, group: str, queue_id: int, min_offset: int
) -> QueueMapping:
    """`mapping` without the oldest closed items of `queue_id` on `group` whose messages
    all lie below `min_offset` (the queue's oldest kept offset: retention removed the
    rest). Only a queue's first items go, so its logic offsets stay continuous; the epoch
    rises only when an item goes."""
    queues = []
    changed = False
    for items in mapping.queues:
        first = 0
        while first < len(items) - 1 and _read(items[first], group, queue_id, min_offset):
            first += 1
        changed |= first > 0
        queues.append(items[first:])
    if not changed:
        return mapping
    return QueueMapping(mapping.topic, mapping.epoch + 1, tuple(queues))


def retire_group(mapping: QueueMapping, group: str) -> QueueMapping:
    """`mapping` without any item of `group`, a drained group about to go: its items must
    all be closed and the oldest of their queues (what came after them lives elsewhere), so
    each queue's logic offsets stay continuous from its new first item on; MappingError
    names the queue otherwise. The epoch rises when an item goes."""
    queues = []
    for q, items in enumerate(mapping.queues):
        first = 0
        while first < len(items) and items[first].group == group:
            first += 1
        rest = items[first:]
        if not rest:
            raise MappingError(
                f"static topic {mapping.topic!r}: logic queue {q} takes its writes on group "
                f"{group!r}; move it to another group first"
            )
        if any(i.group == group for i in rest):
            raise MappingError(
                f"static topic {mapping.topic!r}: logic queue {q} has an item on group "
                f"{group!r} after items of other groups; it cannot be retired before those"
            )
        queues.append(rest)
    if all(len(a) == len(b) for a, b in zip(queues, mapping.queues, strict=True)):
        return mapping
    return QueueMapping(mapping.topic, mapping.epoch + 1, tuple(queues))


def _read(item: MappingItem, group: str, queue_id: int, min_offset: int) -> bool:
    return item.group == group and item.queue_id == queue_id and 0 <= item.end_offset <= min_offset


def balanced_moves(mapping: QueueMapping, groups: Sequence[str]) -> list[tuple[int, str]]:
    """The remaps (logic queue, to group) that spread the logic queues' writes evenly over
    `groups`, moving as few as possible: first every queue led by a group not named, then
    from groups over their share to those under it. Empty when already balanced."""
    if not groups:
        raise MappingError(f"static topic {mapping.topic!r} needs at least one broker group")
    if len(set(groups)) != len(groups):
        raise MappingError(f"static topic {mapping.topic!r}: a broker group is named twice")
    total, n = mapping.total_queues, len(groups)
    share = {g: total // n + (1 if k < total % n else 0) for k, g in enumerate(groups)}
    led = {g: mapping.led_by(g) for g in groups}
    leaving = [q for q in range(total) if mapping.leader(q).group not in share]
    for g in groups:  # a group over its share gives up its highest queues
        leaving += led[g][share[g] :]
        led[g] = led[g][: share[g]]
    moves = []
    for q in sorted(leaving):
        to = min(groups, key=lambda g: (len(led[g]) - share[g], groups.index(g)))
        led[to].append(q)
        if mapping.leader(q).group != to:
            moves.append((q, to))
    return moves


def _int(owner: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MappingError(f"{owner}: {name} must be an integer, got {value!r}")
    return value


def _group(owner: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise MappingError(f"{owner}: group must be a non-empty string, got {value!r}")
    return value
