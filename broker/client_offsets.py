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
from capstan.common.queue_mapping import MappingItem


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

    def read_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        """`bounds` as the pulls of Capstan's SDK read the queue here: a static topic's
        logic queue led here starts at its oldest item, whichever group keeps it (those
        reads are passed there: broker/edge/v1/older_reads.py)."""
        low, high = self.bounds(topic, queue_id)
        view = self._static.view(topic)
        if view is not None and view.older_groups_of(queue_id):
            oldest = view.mapping.items(queue_id)[0].logic_offset
            low, high = oldest, max(high, oldest)
        return low, high

    def older_item(self, topic: str, queue_id: int, offset: int) -> MappingItem | None:
        """The item of another group that keeps logic offset `offset` of a logic queue led
        here; None for any other offset or queue."""
        view = self._static.view(topic)
        return None if view is None else view.older_item(queue_id, offset)

    def older_groups(self, topic: str, queue_id: int) -> list[str]:
        """The other groups that keep older items of a logic queue led here, newest first."""
        view = self._static.view(topic)
        return [] if view is None else view.older_groups_of(queue_id)

    def committed(self, group: str, topic: str, queue_id: int) -> int | None:
        found = self._store.consumer_offsets.query(group, topic, queue_id)
        return None if found is None else self.to_client(topic, queue_id, found)

    def start_for(self, group: str, topic: str, queue_id: int) -> int | None:
        """Where a consumer of `group` taking the queue here starts: the committed offset;
        for a static topic's logic queue another group leads now, whose items here continue
        another group's and that the group never committed here, the start of its first
        item here (its reads of the earlier items were the earlier group's). None: neither
        (for a logic queue led here, the older items' groups are asked next:
        broker/edge/v1/older_reads.py)."""
        found = self.committed(group, topic, queue_id)
        if found is not None:
            return found
        view = self._static.view(topic)
        items = view.items_here.get(queue_id, ()) if view is not None else ()
        if view is None or not items or view.mapping.items(queue_id)[0].group == view.group:
            return None
        if queue_id in view.led:  # the older items' groups are asked (older_reads.py)
            return None
        return items[0].logic_offset

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        physical = self.to_physical(topic, queue_id, offset)
        self._store.consumer_offsets.commit(group, topic, queue_id, physical)

    def for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        """The first offset stored at or after `timestamp_ms` (None when none is)."""
        found = self._store.offset_for_time(topic, queue_id, timestamp_ms)
        return None if found is None else self.to_client(topic, queue_id, found)
