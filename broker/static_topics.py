"""The static topics of this broker's group: their mappings, and what a logic queue is here.

A static topic's logic queue q is kept, on every group that holds an item of it, in that
group's physical queue of the item (the controller gives logic queue q physical queue q on
each group, capstan/common/queue_mapping.py). The topic's config on this broker has as many
queues as the topic has logic queues, and its writes are refused for the queues another
group leads.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace

from capstan.broker.store.queue_mappings import QueueMappingStore
from capstan.broker.store.topic_config import TopicConfig, TopicConfigStore
from capstan.common.errors import CapstanError
from capstan.common.queue_mapping import (
    MappingError,
    MappingItem,
    QueueMapping,
    logic_of,
    physical_of,
    physical_queue_count,
)


@dataclass(frozen=True)
class StaticView:
    """What one static topic's mapping means on this group."""

    mapping: QueueMapping
    group: str
    led: frozenset[int]
    """The logic queues whose writes this group takes."""
    led_order: tuple[int, ...]
    """The same, in id order: what sends that name no queue go round."""
    items_here: dict[int, tuple[MappingItem, ...]]
    """Per logic queue held here, its items on this group that hold messages, oldest first."""
    led_shift: dict[int, tuple[int, int]]
    """Per logic queue this group leads, (its open item's physical start, logic offset
    minus physical offset in it): a stored message's logic offset in one addition."""
    gates: dict[int, tuple[tuple[int, MappingItem], ...]]
    """Per logic queue held here, for each item here that continues an item of another
    group: (the physical offset it starts at, that earlier item). A FIFO consumer group
    reads past such a start only once it has finished the earlier item (OrderGate)."""
    fronted: tuple[int, ...] = ()
    """The logic queues whose last item is here (led, or moving here), in id order: routes
    name each logic queue on this group alone, which serves all its reads, the older
    items' too (broker/edge/v2/older_items.py, broker/edge/v1/older_reads.py)."""
    older_groups: tuple[str, ...] = ()
    """The other groups that keep older items of the logic queues fronted here."""
    newer_groups: tuple[str, ...] = ()
    """The groups that front the logic queues this group keeps older items of: a client
    whose route is not yet refreshed is served their messages here too."""

    @classmethod
    def of(cls, mapping: QueueMapping, group: str) -> StaticView:
        led = tuple(mapping.led_by(group))
        here = mapping.hosted_by(group)
        items = {q: tuple(i for i in found if not i.is_pending) for q, found in here.items()}
        gates = {}
        for q in here:
            whole = mapping.items(q)
            found = tuple(
                (item.start_offset, before)
                for before, item in itertools.pairwise(whole)
                if item.group == group and not item.is_pending and before.group != group
            )
            if found:
                gates[q] = found
        shift = {}
        for q in led:
            item = mapping.leader(q)
            shift[q] = (item.start_offset, item.logic_offset - item.start_offset)
        fronted = tuple(mapping.fronted_by(group))
        older = sorted(
            {
                i.group
                for q in fronted
                for i in mapping.items(q)[:-1]
                if i.group != group and not i.is_pending
            }
        )
        newer = sorted({mapping.queues[q][-1].group for q in here if q not in fronted})
        return cls(
            mapping,
            group,
            frozenset(led),
            led,
            items,
            shift,
            gates,
            fronted,
            tuple(older),
            tuple(newer),
        )

    def older_item(self, queue: int, logic: int) -> MappingItem | None:
        """The item of another group that holds logic offset `logic` of logic queue
        `queue`, which this group fronts (the oldest item for an offset before it); None
        when this group holds that offset, or does not front the queue."""
        if queue not in self.fronted:
            return None
        for item in self.mapping.items(queue):
            end = item.logic_end
            if not item.is_pending and (end is None or logic < end):
                return item if item.group != self.group else None
        return None

    def shared_with(self, group: str) -> frozenset[int]:
        """The logic queues with items (or a pending one) both here and on `group`."""
        return frozenset(
            q
            for q, items in enumerate(self.mapping.queues)
            if any(i.group == group for i in items) and any(i.group == self.group for i in items)
        )

    def older_groups_of(self, queue: int) -> list[str]:
        """The other groups that keep older items of logic queue `queue`, which this group
        fronts, the newest item's first (empty when it does not front it)."""
        if queue not in self.fronted:
            return []
        found: list[str] = []
        for item in reversed(self.mapping.items(queue)[:-1]):
            if item.group != self.group and item.group not in found and not item.is_pending:
                found.append(item.group)
        return found

    def logic_offset(self, queue: int, physical: int) -> int:
        """The logic offset of physical offset `physical` of this group's queue `queue`
        (`logic_of`); the same offset for a queue the group does not hold."""
        led = self.led_shift.get(queue)
        if led is not None and physical >= led[0]:  # in the open item: most reads and writes
            return physical + led[1]
        return logic_of(self.items_here.get(queue, ()), physical)

    def physical_offset(self, queue: int, logic: int) -> int:
        """Where logic offset `logic` of logic queue `queue` is read on this group
        (`physical_of`)."""
        return physical_of(self.items_here.get(queue, ()), logic)


class StaticTopicRefused(CapstanError):
    """A mapping this broker will not take; the message says why."""


class StaticTopics:
    def __init__(self, topics: TopicConfigStore, mappings: QueueMappingStore, group: str) -> None:
        self._topics = topics
        self._mappings = mappings
        self._views: dict[str, StaticView] = {}
        self.group = group
        """This broker's group (its broker name), as mappings name it."""

    def mapping(self, topic: str) -> QueueMapping | None:
        """The topic's mapping, None for a topic that is not static."""
        return self._mappings.get(topic)

    def view(self, topic: str) -> StaticView | None:
        """What the topic's mapping means here; None for a topic that is not static.
        Asked once per request: kept until the mapping changes."""
        mapping = self._mappings.get(topic)
        if mapping is None:
            return None
        view = self._views.get(topic)
        if view is None or view.mapping is not mapping:
            view = self._views[topic] = StaticView.of(mapping, self.group)
        return view

    def to_logic(self, topic: str, queue: int, physical: int) -> int:
        """A physical offset of `topic`'s queue here as clients see it: the logic offset
        for a static topic's queue held here, the same offset otherwise."""
        view = self.view(topic)
        return physical if view is None else view.logic_offset(queue, physical)

    def to_physical(self, topic: str, queue: int, offset: int) -> int:
        """The physical offset here of an offset a client named (`to_logic`'s inverse)."""
        view = self.view(topic)
        return offset if view is None else view.physical_offset(queue, offset)

    def queue_count(self, mapping: QueueMapping) -> int:
        """The queue count of the static topic's config here: every logic queue, and every
        physical queue this group's items use."""
        return max(physical_queue_count(mapping, self.group), mapping.total_queues)

    def adopt(self, config: TopicConfig, mapping: QueueMapping) -> QueueMapping:
        """Take a static topic's config and mapping (the controller's); the mapping held
        afterwards (a newer one already held stays, with the settings held).
        StaticTopicRefused when the mapping gives this group nothing, or the name is a
        normal topic's here."""
        if mapping.topic != config.name:
            raise StaticTopicRefused(
                f"the mapping is of topic {mapping.topic!r}, the config of {config.name!r}"
            )
        held = self.mapping(config.name)
        if held is None and self._topics.get(config.name) is not None:
            raise StaticTopicRefused(
                f"topic {config.name!r} exists on group {self.group!r} as a normal topic; "
                "a static topic needs a name of its own"
            )
        newer = held is None or mapping.epoch > held.epoch
        if newer and self.group not in mapping.groups():
            raise StaticTopicRefused(
                f"group {self.group!r} holds no queue of static topic {config.name!r}"
            )
        stale = held is not None and mapping.epoch < held.epoch
        try:
            held = self._mappings.adopt(mapping)
        except MappingError as exc:
            raise StaticTopicRefused(str(exc)) from exc
        queues = self.queue_count(held)
        existing = self._topics.get(config.name)
        if stale and existing is not None:
            config = existing  # a late hand-on carries settings older than those held
        self._topics.put(replace(config, read_queue_nums=queues, write_queue_nums=queues))
        return held


@dataclass(frozen=True, slots=True)
class OrderCheck:
    """Whether consumer group `group` has finished, on group `before.group`, the item
    `before` of logic queue `queue` of `topic`: read up to its logic end."""

    group: str
    topic: str
    queue: int
    before: MappingItem


class OrderGate:
    """FIFO order of a static topic's logic queues across moves (issue 31).

    When a logic queue moves, its new item's messages of a message group follow the old
    item's. A FIFO consumer group is handed nothing of an item here that continues
    another group's item until it has finished that item there: its reads of the queue
    stop at the item's start (`stop_at`), and a read that reaches it asks for the check
    (`blocked`), which the broker makes by asking the other group (static_order_checks.py)
    and records with `passed`. A passed check stays passed: a group's offsets there only
    move on (an admin reset takes the group back on purpose, and order with it).
    """

    def __init__(
        self,
        static: StaticTopics,
        committed: Callable[[str, str, int], int | None] = lambda group, topic, queue: None,
    ) -> None:
        """`committed(group, topic, queue)`: the group's committed physical offset of the
        queue here (a pull consumer that read the older items through this group and
        committed at or past an item's start is done with the items before it)."""
        self._static = static
        self._committed = committed
        self._passed: set[OrderCheck] = set()
        self._wanted: set[OrderCheck] = set()

    def stop_at(self, group: str, topic: str, queue: int, pulled: bool = False) -> int | None:
        """The physical offset of this group's queue `queue` that consumer group `group`
        may not read at or past yet; None when nothing holds it. A `pulled` read (the pull
        API, whose consumers commit what they consumed) is also freed by a commit here at
        or past the start (not a pop read: pop commits its own start unasked)."""
        view = self._static.view(topic)
        if view is None:
            return None
        for start, before in view.gates.get(queue, ()):
            check = OrderCheck(group, topic, queue, before)
            if check in self._passed:
                continue
            committed = self._committed(group, topic, queue) if pulled else None
            if committed is None or committed < start:
                return start
            self.passed(check)
        return None

    def blocked(self, group: str, topic: str, queue: int) -> None:
        """A read of `group` reached `stop_at`: the check that would free it is wanted."""
        view = self._static.view(topic)
        if view is None:
            return
        for _, before in view.gates.get(queue, ()):
            check = OrderCheck(group, topic, queue, before)
            if check not in self._passed:
                self._wanted.add(check)
                return

    def wanted(self) -> list[OrderCheck]:
        """The checks reads wait for, dropping those whose item left the mapping."""
        for check in list(self._wanted):
            view = self._static.view(check.topic)
            gates = () if view is None else view.gates.get(check.queue, ())
            if all(before != check.before for _, before in gates):
                self._wanted.discard(check)
        return sorted(self._wanted, key=lambda c: (c.topic, c.queue, c.group))

    def passed(self, check: OrderCheck) -> None:
        self._wanted.discard(check)
        self._passed.add(check)
