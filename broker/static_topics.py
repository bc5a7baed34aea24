"""The static topics of this broker's group: their mappings, and what a logic queue is here.

A static topic's logic queue q is kept, on every group that holds an item of it, in that
group's physical queue of the item (the controller gives logic queue q physical queue q on
each group, capstan/common/queue_mapping.py). The topic's config on this broker has as many
queues as the topic has logic queues, and its writes are refused for the queues another
group leads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from capstan.broker.store.queue_mappings import QueueMappingStore
from capstan.broker.store.topic_config import TopicConfig, TopicConfigStore
from capstan.common.errors import CapstanError
from capstan.common.queue_mapping import (
    MappingError,
    MappingItem,
    QueueMapping,
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
    hosted: tuple[int, ...]
    """The logic queues with any item here (the led ones too), in id order."""
    items_here: dict[int, tuple[MappingItem, ...]]
    """Per logic queue held here, its items on this group that hold messages, oldest first."""

    @classmethod
    def of(cls, mapping: QueueMapping, group: str) -> StaticView:
        led = tuple(mapping.led_by(group))
        here = mapping.hosted_by(group)
        items = {q: tuple(i for i in found if not i.is_pending) for q, found in here.items()}
        return cls(mapping, group, frozenset(led), led, tuple(sorted(here)), items)

    def logic_offset(self, queue: int, physical: int) -> int:
        """The logic offset of physical offset `physical` of this group's queue `queue`:
        through the newest item here that starts at or before it."""
        here = self.items_here.get(queue)
        if not here:
            return physical
        for item in reversed(here):
            if item.start_offset <= physical:
                return item.logic(physical)
        return here[0].logic(physical)


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

    def adopt(self, config: TopicConfig, mapping: QueueMapping) -> QueueMapping:
        """Take a static topic's config and mapping (the controller's); the mapping held
        afterwards (a newer one already held stays). StaticTopicRefused when the mapping
        gives this group nothing, or the name is a normal topic's here."""
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
        try:
            held = self._mappings.adopt(mapping)
        except MappingError as exc:
            raise StaticTopicRefused(str(exc)) from exc
        queues = max(physical_queue_count(held, self.group), held.total_queues)
        self._topics.put(replace(config, read_queue_nums=queues, write_queue_nums=queues))
        return held
