"""The queue mappings of the static topics a broker's group serves, kept durably.

The controller decides a static topic's mapping (capstan/common/queue_mapping.py) and
hands it to every group that holds an item of it; each broker keeps the whole mapping in
one file (`queueMappings.json`, like RocketMQ's `topicQueueMapping.json`) through
`JsonConfigTable`, and its slaves copy that file with the topics. A mapping replaces the one
held only when its epoch is newer: a late or repeated hand-over of an older mapping
changes nothing.
"""

from __future__ import annotations

from pathlib import Path

from capstan.broker.store.atomic_file import JsonConfigTable
from capstan.common.queue_mapping import MappingError, QueueMapping

MAPPINGS_TABLE_KEY = "topicQueueMappings"


class QueueMappingStore(JsonConfigTable[QueueMapping]):
    def __init__(self, path: Path) -> None:
        super().__init__(
            path, MAPPINGS_TABLE_KEY, QueueMapping.to_dict, QueueMapping.from_dict, _topic
        )

    def adopt(self, mapping: QueueMapping) -> QueueMapping:
        """Keep `mapping` unless one of the same topic with a newer epoch is held; return
        the mapping held afterwards. MappingError when another mapping holds the same
        epoch: two deciders disagree, and neither may win silently."""
        with self._lock:
            held = self._records.get(mapping.topic)
            if held is not None and held.epoch >= mapping.epoch:
                if held.epoch == mapping.epoch and held != mapping:
                    raise MappingError(
                        f"static topic {mapping.topic!r}: a different mapping with epoch "
                        f"{mapping.epoch} is held already"
                    )
                return held
            self._commit_locked({**self._records, mapping.topic: mapping})
            return mapping


def _topic(mapping: QueueMapping) -> str:
    return mapping.topic
