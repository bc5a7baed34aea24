"""A message as one broker hands it to another group's master to store
(capstan.v1.HandedMessage): an acting master's escapes (replication/escape.py) and a static
topic's placements (group_links.py, static_placement.py)."""

from __future__ import annotations

from capstan.broker.store.message import Message
from capstan.v1.handed_message_pb2 import HandedMessage


def to_handed(m: Message) -> HandedMessage:
    return HandedMessage(
        topic=m.topic,
        queue_id=m.queue_id,
        body=m.body,
        properties=m.properties,
        flag=m.flag,
        sys_flag=m.sys_flag,
        born_timestamp_ms=m.born_timestamp_ms,
        born_host=m.born_host,
        reconsume_times=m.reconsume_times,
    )


def from_handed(h: HandedMessage) -> Message:
    """The message to store, in the queue `h` names; the receiver may choose another."""
    return Message(
        topic=h.topic,
        queue_id=h.queue_id,
        body=h.body,
        properties=dict(h.properties),
        flag=h.flag,
        sys_flag=h.sys_flag,
        born_timestamp_ms=h.born_timestamp_ms,
        born_host=h.born_host,
        reconsume_times=h.reconsume_times,
    )
