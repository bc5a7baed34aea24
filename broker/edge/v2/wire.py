"""Converting between `apache.rocketmq.v2.Message` and the store's messages.

A v2 message's system properties become RocketMQ's classic message properties (TAGS, KEYS,
UNIQ_CLIENT_MESSAGE_ID_KEYIDX, __SHARDINGKEY, __STARTDELIVERTIME, …) so the CommitLog
holds one format whichever protocol wrote it. Delivered messages carry what the official
clients check: body_encoding (GZIP for a body a producer sent compressed, else IDENTITY),
an upper-case CRC32 digest (the body CRC the store already keeps), and
delivery_attempt >= 1.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Final

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.broker.pop.pop_service import Delivery
from capstan.broker.store.message import (
    LOCALHOST,
    SYSFLAG_COMPRESSED,
    StoredMessage,
    pack_host,
    unpack_host,
)
from capstan.broker.store.properties import (
    KEY_SEPARATOR,
    PROPERTY_BORN_HOST_NAME,
    PROPERTY_CHECK_AFTER_MS,
    PROPERTY_CHECK_TIMES,
    PROPERTY_DELAY_LEVEL,
    PROPERTY_DELIVER_TIME_MS,
    PROPERTY_KEYS,
    PROPERTY_MESSAGE_GROUP,
    PROPERTY_PREPARED_QUEUE_OFFSET,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRACE_CONTEXT,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_KEY,
)

# Python 5.1.2 copies a user's delivery time straight into Timestamp.seconds, and its docs
# disagree on whether that is seconds or milliseconds. No real date in seconds is this large.
_SECONDS_LOOK_LIKE_MS: Final = 100_000_000_000


def timestamp_ms(ts: Timestamp) -> int:
    if ts.seconds >= _SECONDS_LOOK_LIKE_MS:
        return int(ts.seconds)
    return int(ts.seconds) * 1000 + ts.nanos // 1_000_000


def ms_to_timestamp(ms: int) -> Timestamp:
    ts = Timestamp()
    _set_ms(ts, ms)
    return ts


@functools.lru_cache(maxsize=1024)
def born_host(raw: str) -> tuple[bytes, str | None]:
    """The packed born host, and the original text when it is not an IP address."""
    host = raw.rsplit(":", 1)[0] if raw.count(":") == 1 else raw
    try:
        return pack_host(host.strip("[]"), 0), None
    except ValueError:
        return LOCALHOST, raw or None


_INTERNAL = frozenset(
    {
        PROPERTY_KEYS,
        PROPERTY_TAGS,
        PROPERTY_UNIQ_KEY,
        PROPERTY_MESSAGE_GROUP,
        PROPERTY_DELIVER_TIME_MS,
        PROPERTY_TRACE_CONTEXT,
        PROPERTY_BORN_HOST_NAME,
        PROPERTY_TRANSACTION_PREPARED,
        PROPERTY_REAL_TOPIC,
        PROPERTY_REAL_QUEUE_ID,
        PROPERTY_TIMER_DELIVER_MS,
        PROPERTY_DELAY_LEVEL,
        PROPERTY_TRANSACTION_ID,
        PROPERTY_CHECK_TIMES,
        PROPERTY_CHECK_AFTER_MS,
        PROPERTY_PREPARED_QUEUE_OFFSET,
    }
)


def message_type_of(props: Mapping[str, str], transactional: bool = False) -> int:
    if transactional:
        return pb.TRANSACTION
    if PROPERTY_MESSAGE_GROUP in props:
        return pb.FIFO
    if PROPERTY_DELIVER_TIME_MS in props:
        return pb.DELAY
    return pb.NORMAL


def to_wire(
    m: StoredMessage,
    store_host: str,
    delivery: Delivery | None = None,
    topic: str | None = None,
    transactional: bool = False,
) -> pb.Message:
    """A stored message as the official clients expect to receive it."""
    out = pb.Message()
    fill_wire(out, m, store_host, delivery, topic, transactional)
    return out


def fill_wire(
    out: pb.Message,
    m: StoredMessage,
    store_host: str,
    delivery: Delivery | None = None,
    topic: str | None = None,
    transactional: bool = False,
) -> None:
    """Write `to_wire`'s message into `out`, an empty message (say, the `message` field of
    a response): built in place, nothing of it is copied afterwards."""
    props = m.properties
    get = props.get
    out.topic.name = topic or m.topic
    out.body = m.body
    sp = out.system_properties
    sp.message_id = get(PROPERTY_UNIQ_KEY) or m.offset_msg_id
    digest = sp.body_digest
    digest.type = pb.CRC32
    digest.checksum = f"{m.body_crc:08X}"
    sp.body_encoding = pb.GZIP if m.sys_flag & SYSFLAG_COMPRESSED else pb.IDENTITY
    sp.message_type = message_type_of(props, transactional)
    _set_ms(sp.born_timestamp, m.born_timestamp_ms)
    sp.born_host = get(PROPERTY_BORN_HOST_NAME) or unpack_host(m.born_host)[0]
    _set_ms(sp.store_timestamp, m.store_timestamp_ms)
    sp.store_host = store_host
    sp.queue_id = m.queue_id
    sp.queue_offset = m.queue_offset
    user = None
    for name, value in props.items():
        if name not in _INTERNAL:
            if user is None:
                user = out.user_properties
            user[name] = value
    tag = get(PROPERTY_TAGS)
    if tag is not None:
        sp.tag = tag
    keys = get(PROPERTY_KEYS)
    if keys:
        sp.keys.extend([k for k in keys.split(KEY_SEPARATOR) if k])
    group = get(PROPERTY_MESSAGE_GROUP)
    if group is not None:
        sp.message_group = group
    deliver_ms = get(PROPERTY_DELIVER_TIME_MS)
    if deliver_ms is not None and deliver_ms.isdigit():
        _set_ms(sp.delivery_timestamp, int(deliver_ms))
    trace = get(PROPERTY_TRACE_CONTEXT)
    if trace is not None:
        sp.trace_context = trace
    if delivery is not None:
        sp.receipt_handle = delivery.receipt_handle
        sp.delivery_attempt = delivery.delivery_attempt
        if delivery.invisible_ms:
            _set_ms(sp.invisible_duration, delivery.invisible_ms)
    else:
        sp.delivery_attempt = m.reconsume_times + 1


def _set_ms(field: Timestamp | Duration, ms: int) -> None:
    """Set a Timestamp or Duration field to `ms` milliseconds, in place (floor division,
    so nanos stay within 0..999,999,999)."""
    field.seconds = ms // 1000
    nanos = ms % 1000 * 1_000_000
    if nanos:
        field.nanos = nanos
