"""Moving a message to another topic and back: the timer, half messages and dead letters
all store a copy of a message elsewhere, remembering where it really belongs."""

from __future__ import annotations

from collections.abc import Iterable

from capstan.broker.store.message import SYSFLAG_COMPRESSED, Message, StoredMessage
from capstan.broker.store.properties import PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC


def copy_message(
    source: Message | StoredMessage,
    topic: str,
    queue_id: int,
    properties: dict[str, str],
    reconsume_times: int | None = None,
) -> Message:
    """`source` with a new place and properties; body, flag, born fields and whether the
    body is compressed kept."""
    return Message(
        topic=topic,
        queue_id=queue_id,
        body=source.body,
        properties=properties,
        flag=source.flag,
        sys_flag=source.sys_flag & SYSFLAG_COMPRESSED,
        born_timestamp_ms=source.born_timestamp_ms,
        born_host=source.born_host,
        reconsume_times=source.reconsume_times if reconsume_times is None else reconsume_times,
    )


def park(message: Message, topic: str, extra: dict[str, str]) -> Message:
    """A copy in queue 0 of `topic` that remembers its real topic and queue."""
    props = dict(message.properties)
    props[PROPERTY_REAL_TOPIC] = message.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(message.queue_id)
    props.update(extra)
    return copy_message(message, topic, 0, props)


def unpark(parked: StoredMessage, drop: Iterable[str] = ()) -> Message | None:
    """The message back in its real topic and queue, without the properties in `drop`;
    None if the parked copy does not say where it belongs."""
    props = dict(parked.properties)
    topic = props.pop(PROPERTY_REAL_TOPIC, None)
    qid = props.pop(PROPERTY_REAL_QUEUE_ID, "0")
    for name in drop:
        props.pop(name, None)
    if topic is None or not qid.isdigit():
        return None
    return copy_message(parked, topic, int(qid), props)
