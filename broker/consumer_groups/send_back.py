"""Send-back: a message a push consumer failed goes to its group's retry topic, later.

RocketMQ's CONSUMER_SEND_MSG_BACK: the broker reads the failed message where it is stored,
and stores a copy in `%RETRY%<group>` that the timer delivers after the delay of a level
(3 + reconsume times unless the client names one: 10 s, 30 s, 1 min, 2 min, ...). The copy
counts one more consumption and remembers the real topic (RETRY_TOPIC) and the first
message id (ORIGIN_MESSAGE_ID), so the consumer hands its listener the original topic.
Once a message has been consumed `max_reconsume_times` times, or when the client asks with
a negative level (-1 by convention), the copy goes to `%DLQ%<group>` instead and is not
delivered again. A level past the last one waits the last one's delay (2 h), as RocketMQ's
broker does: a send-back is never refused for its level, since a consumer whose send-back
fails keeps the message and tries it again itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from capstan.broker.relocation import copy_message
from capstan.broker.store.message import Message, StoredMessage
from capstan.broker.store.properties import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_UNIQ_KEY,
)
from capstan.broker.system_topics import DELAY_LEVELS_MS, dlq_topic, retry_topic

FIRST_RETRY_LEVEL = 3
"""Level of the first retry when the client leaves it to the broker: 10 s."""


@dataclass(frozen=True)
class SendBackPlan:
    message: Message
    dead_letter: bool
    deliver_at_ms: int
    """0 for a dead letter (stored at once)."""


def plan_send_back(
    failed: StoredMessage, group: str, delay_level: int, max_reconsume_times: int, now_ms: int
) -> SendBackPlan:
    """Where and when the copy of `failed` goes."""
    props = dict(failed.properties)
    props.pop(PROPERTY_DELAY_LEVEL, None)
    props.setdefault(PROPERTY_RETRY_TOPIC, failed.topic)
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, props.get(PROPERTY_UNIQ_KEY, failed.offset_msg_id))
    consumed = failed.reconsume_times + 1
    if delay_level < 0 or failed.reconsume_times >= max_reconsume_times:
        props[PROPERTY_DLQ_ORIGIN_TOPIC] = props[PROPERTY_RETRY_TOPIC]
        copy = copy_message(failed, dlq_topic(group), 0, props, reconsume_times=consumed)
        return SendBackPlan(copy, True, 0)
    level = delay_level or FIRST_RETRY_LEVEL + failed.reconsume_times
    level = min(level, len(DELAY_LEVELS_MS))
    copy = copy_message(failed, retry_topic(group), 0, props, reconsume_times=consumed)
    return SendBackPlan(copy, False, now_ms + DELAY_LEVELS_MS[level - 1])
