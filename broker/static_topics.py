"""The static topics of this broker's group: their mappings, and what a logic queue is here.

A static topic's logic queue q is kept, on every group that holds an item of it, in that
group's physical queue of the item (the controller gives logic queue q physical queue q on
each group, capstan/common/queue_mapping.py). The topic's config on this broker has as many
queues as the topic has logic queues, and its writes are refused for the queues another
group leads.
"""

from __future__ import annotations

from dataclasses import replace

from capstan.broker.store.queue_mappings import QueueMappingStore
from capstan.broker.store.topic_config import TopicConfig, TopicConfigStore
from capstan.common.errors import CapstanError
from capstan.common.queue_mapping import MappingError, QueueMapping, physical_queue_count


class StaticTopicRefused(CapstanError):
    """A mapping this broker will not take; the message says why."""


class StaticTopics:
    def __init__(self, topics: TopicConfigStore, mappings: QueueMappingStore, group: str) -> None:
        self._topics = topics
        self._mappings = mappings
        self.group = group
        """This broker's group (its broker name), as mappings name it."""

    def mapping(self, topic: str) -> QueueMapping | None:
        """The topic's mapping, None for a topic that is not static."""
        return self._mappings.get(topic)

    def adopt(self, config: TopicConfig, mapping: QueueMapping) -> QueueMapping:
        """Take a static topic's config and mapping (the controller's); the mapping held
        afterwards (a newer one already held stays). StaticTopicRefused when the mapping
        gives this group nothing, or the name is a normal topic's here."""
        if mapping.topic != config.name:
            raise StaticTopicRefused(
                f"the mapping is of topic {mapping.topic!r}, the config of {config.name!r}"
            )
        if self.group not in mapping.groups():
            raise StaticTopicRefused(
                f"group {self.group!r} holds no queue of static topic {config.name!r}"
            )
        if self._topics.get(config.name) is not None and self.mapping(config.name) is None:
            raise StaticTopicRefused(
                f"topic {config.name!r} exists on group {self.group!r} as a normal topic; "
                "a static topic needs a name of its own"
            )
        try:
            held = self._mappings.adopt(mapping)
        except MappingError as exc:
            raise StaticTopicRefused(str(exc)) from exc
        queues = max(physical_queue_count(held, self.group), held.total_queues)
        self._topics.put(replace(config, read_queue_nums=queues, write_queue_nums=queues))
        return held
