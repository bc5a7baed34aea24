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

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        physical = self.to_physical(topic, queue_id, offset)
        self._store.consumer_offsets.commit(group, topic, queue_id, physical)

    def for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        """The first offset stored at or after `timestamp_ms` (None when none is)."""
        found = self._store.offset_for_time(topic, queue_id, timestamp_ms)
        return None if found is None else self.to_client(topic, queue_id, found)
