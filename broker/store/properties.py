"""Every message-property name the broker reads or writes: one vocabulary below the edge.

The names are RocketMQ's classic ones (what its brokers and remoting clients put in a
message's properties), plus the few Capstan adds for its own system topics. The CommitLog
holds them whichever protocol wrote the message: the protocol edge maps `apache.rocketmq.v2`
fields onto them (`edge/v2/wire.py`); services and the store import them from here.
"""

from __future__ import annotations

from typing import Final

PROPERTY_KEYS: Final = "KEYS"
PROPERTY_TAGS: Final = "TAGS"
PROPERTY_UNIQ_KEY: Final = "UNIQ_CLIENT_MESSAGE_ID_KEYIDX"
PROPERTY_DELAY_LEVEL: Final = "DELAY"
PROPERTY_DELIVER_TIME_MS: Final = "__STARTDELIVERTIME"
PROPERTY_TRANSACTION_PREPARED: Final = "TRAN_MSG"
PROPERTY_MESSAGE_GROUP: Final = "__SHARDINGKEY"
PROPERTY_REAL_TOPIC: Final = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID: Final = "REAL_QID"
PROPERTY_TIMER_DELIVER_MS: Final = "TIMER_DELIVER_MS"
"""Set on messages parked in the timer topic: when to deliver them, in epoch milliseconds.
Their consume-queue unit carries this time in place of the tag hash, so the timer can
rebuild its schedule from the queue alone."""
PROPERTY_RECALLS: Final = "CAPSTAN_RECALLS"
"""Set on recall markers: the timer-queue offset of the delayed message they cancel."""
PROPERTY_TRACE_CONTEXT: Final = "__TRACE_CONTEXT"
PROPERTY_BORN_HOST_NAME: Final = "__BORN_HOST"
PROPERTY_TRANSACTION_ID: Final = "__TRANSACTION_ID"
PROPERTY_CHECK_TIMES: Final = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_AFTER_MS: Final = "__CHECK_AFTER_MS"
PROPERTY_PREPARED_QUEUE_OFFSET: Final = "TRAN_PREPARED_QUEUE_OFFSET"
"""Set on a committed transactional message: the half message's queue offset, so a commit
is never stored twice for one half message."""
PROPERTY_ORIGIN_MESSAGE_ID: Final = "ORIGIN_MESSAGE_ID"
PROPERTY_DLQ_ORIGIN_TOPIC: Final = "DLQ_ORIGIN_TOPIC"
PROPERTY_RETRY_TOPIC: Final = "RETRY_TOPIC"
PROPERTY_MAX_OFFSET: Final = "MAX_OFFSET"
PROPERTY_MIN_OFFSET: Final = "MIN_OFFSET"

KEY_SEPARATOR: Final = " "
"""Between the keys of PROPERTY_KEYS."""

RESERVED_PROPERTIES: Final = frozenset(
    {
        PROPERTY_KEYS,
        PROPERTY_TAGS,
        PROPERTY_UNIQ_KEY,
        PROPERTY_DELAY_LEVEL,
        PROPERTY_DELIVER_TIME_MS,
        PROPERTY_MESSAGE_GROUP,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_TRACE_CONTEXT,
        PROPERTY_BORN_HOST_NAME,
        PROPERTY_TRANSACTION_ID,
        PROPERTY_CHECK_TIMES,
        PROPERTY_CHECK_AFTER_MS,
        PROPERTY_PREPARED_QUEUE_OFFSET,
        PROPERTY_ORIGIN_MESSAGE_ID,
        PROPERTY_DLQ_ORIGIN_TOPIC,
        PROPERTY_RETRY_TOPIC,
        PROPERTY_MAX_OFFSET,
        PROPERTY_MIN_OFFSET,
    }
)
"""Property names the broker itself sets; a producer may not send them."""
