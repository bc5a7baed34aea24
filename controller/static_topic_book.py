"""The controller's book of static topics: each one's queue mapping
(capstan/common/queue_mapping.py), the authority the brokers' copies come from.

The mappings live in the controller's state document beside the replica bookkeeping:

    {"staticTopics": {<topic>: QueueMapping.to_dict()}, ...}

and change by compare-and-swap like it (state_store.change_state), so two controller
replicas, or two calls at once, never both win: a change names the epoch it was decided
from, and is refused when the book has moved on meanwhile.
"""

from __future__ import annotations

from typing import Any

from capstan.common.errors import CapstanError
from capstan.common.queue_mapping import QueueMapping
from capstan.controller.state_store import StateStore, change_state

STATIC_TOPICS_KEY = "staticTopics"


class MappingMoved(CapstanError):
    """The book's mapping is not the one a change was decided from."""


class StaticTopicBook:
    def __init__(self, store: StateStore) -> None:
        self._store = store

    def get(self, topic: str) -> QueueMapping | None:
        raw = self._store.read().document.get(STATIC_TOPICS_KEY, {}).get(topic)
        return None if raw is None else QueueMapping.from_dict(raw)

    def all(self) -> list[QueueMapping]:
        """Every static topic's mapping, by topic name."""
        table = self._store.read().document.get(STATIC_TOPICS_KEY, {})
        return [QueueMapping.from_dict(table[name]) for name in sorted(table)]

    def put(self, mapping: QueueMapping, decided_from: int | None) -> None:
        """Record `mapping`, decided from the book's mapping of epoch `decided_from` (None:
        from none, a new static topic); MappingMoved when the book holds another."""

        def decide(document: dict[str, Any]) -> None:
            table = document.setdefault(STATIC_TOPICS_KEY, {})
            held = table.get(mapping.topic)
            epoch = None if held is None else QueueMapping.from_dict(held).epoch
            if epoch != decided_from:
                raise MappingMoved(
                    f"static topic {mapping.topic!r} is at epoch {epoch}, not "
                    f"{decided_from}: it changed meanwhile; decide again"
                )
            table[mapping.topic] = mapping.to_dict()

        change_state(self._store, decide)

    def delete(self, topic: str) -> bool:
        """Forget a static topic; whether the book had it."""

        def decide(document: dict[str, Any]) -> bool:
            return document.get(STATIC_TOPICS_KEY, {}).pop(topic, None) is not None

        return change_state(self._store, decide)
