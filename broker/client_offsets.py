"""Queue offsets as clients name them: a group's committed offsets, a queue's bounds, the
offset of a point in time.

The store keeps physical offsets. For a static topic's queue held here the clients' offsets
are logic offsets (broker/static_topics.py), translated both ways here, so every API that
takes or answers an offset (the v2 offset RPCs, capstan.v1's Consumer service, the admin's
group positions and resets) speaks one language; for any other queue both are the same.
"""

from __future__ import annotations

from capstan.broker.static_topics import StaticTopics
from capstan.broker.store.message_store import MessageStore


class ClientOffsets:
    def __init__(self, store: MessageStore, static: StaticTopics) -> None:
        self._store = store
        self._static = static

    def to_client(self, topic: str, queue_id: int, physical: int) -> int:
        return self._static.to_logic(topic, queue_id, physical)

    def to_physical(self, topic: str, queue_id: int, offset: int) -> int:
        return self._static.to_physical(topic, queue_id, offset)

    def bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """The queue's first offset and the one after its last ((0, 0) for none)."""
        found = self._store.queue_bounds(topic, queue_id)
        if found is None:
            return (0, 0)
        low, high = found
        return self.to_client(topic, queue_id, low), self.to_client(topic, queue_id, high)

    def committed(self, group: str, topic: str, queue_id: int) -> int | None:
        found = self._store.consumer_offsets.query(group, topic, queue_id)
        return None if found is None else self.to_client(topic, queue_id, found)

    def start_for(self, group: str, topic: str, queue_id: int) -> int | None:
        """Where a consumer of `group` taking the queue here starts: the committed offset;
        for a static topic's logic queue whose items here continue another group's (it
        moved here) and that the group never committed here, the start of its first item
        here, whatever the consumer's consume-from-where: its reads of the earlier items
        are the earlier group's, and what was written here since the move is not skipped
        (a consumer learns of the move from its routes, seconds after it). None: neither."""
        found = self.committed(group, topic, queue_id)
        if found is not None:
            return found
        view = self._static.view(topic)
        items = view.items_here.get(queue_id, ()) if view is not None else ()
        if view is None or not items or view.mapping.items(queue_id)[0].group == view.group:
            return None
        return items[0].logic_offset

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        physical = self.to_physical(topic, queue_id, offset)
        self._store.consumer_offsets.commit(group, topic, queue_id, physical)

    def for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        """The first offset stored at or after `timestamp_ms` (None when none is)."""
        found = self._store.offset_for_time(topic, queue_id, timestamp_ms)
        return None if found is None else self.to_client(topic, queue_id, found)
