"""A message queue as the consumer names it: topic, broker group and queue id."""

from __future__ import annotations

from typing import NamedTuple

RETRY_PREFIX = "%RETRY%"


def retry_topic(group: str) -> str:
    """The topic a group's failed messages come back through."""
    return RETRY_PREFIX + group


class MessageQueue(NamedTuple):
    """Sorts by topic, broker name, then queue id: the order allocation works over."""

    topic: str
    broker_name: str
    queue_id: int

    def __str__(self) -> str:
        return f"{self.topic}@{self.broker_name}:{self.queue_id}"
