"""A message as a consumer's listener sees it (RocketMQ's MessageExt).

It wraps the pulled protobuf without copying it: fields are read when asked for. A message
that came back through the group's retry topic shows its original topic; `message_queue`
and `queue_offset` still say where it was pulled from, which is what offsets refer to.
A body its producer sent compressed (gzip, or zlib from RocketMQ 4 clients) is inflated
when first read.
"""

from __future__ import annotations

import zlib

from capstan.client.consumer.message_queue import RETRY_PREFIX, MessageQueue
from capstan.v1 import pull_pb2

RETRY_TOPIC_PROPERTY = "RETRY_TOPIC"
ORIGIN_MESSAGE_ID_PROPERTY = "ORIGIN_MESSAGE_ID"
_TAGS = "TAGS"
_KEYS = "KEYS"
_MESSAGE_GROUP = "__SHARDINGKEY"
_COMPRESSED = 0x1
"""The stored sys_flag bit of a compressed body (RocketMQ's MessageSysFlag)."""
_GZIP_OR_ZLIB = 32 + zlib.MAX_WBITS
"""zlib's window-bits setting that accepts either header."""
_SYSTEM = frozenset(
    {
        _TAGS,
        _KEYS,
        _MESSAGE_GROUP,
        RETRY_TOPIC_PROPERTY,
        ORIGIN_MESSAGE_ID_PROPERTY,
        "UNIQ_CLIENT_MESSAGE_ID_KEYIDX",
        "DLQ_ORIGIN_TOPIC",
        "REAL_TOPIC",
        "REAL_QID",
        "TIMER_DELIVER_MS",
        "__STARTDELIVERTIME",
        "DELAY",
        "TRAN_MSG",
        "PGROUP",
        "__transactionId__",
        "TRANSACTION_CHECK_TIMES",
        "MIN_OFFSET",
        "MAX_OFFSET",
    }
)


class ReceivedMessage:
    __slots__ = ("_body", "_pb", "message_queue")

    def __init__(self, pulled: pull_pb2.PulledMessage, message_queue: MessageQueue) -> None:
        self._pb = pulled
        self.message_queue = message_queue
        self._body: bytes | None = None

    @property
    def topic(self) -> str:
        """The topic the producer sent to (for a retried message too)."""
        return self._pb.properties.get(RETRY_TOPIC_PROPERTY) or self.message_queue.topic

    @property
    def queue_offset(self) -> int:
        return self._pb.queue_offset

    @property
    def queue_id(self) -> int:
        return self.message_queue.queue_id

    @property
    def commit_log_offset(self) -> int:
        return self._pb.commit_log_offset

    @property
    def body(self) -> bytes:
        """The body as the producer wrote it (inflated if it was sent compressed); a
        compressed body that does not inflate raises zlib.error."""
        if self._body is None:
            raw = self._pb.body
            compressed = self._pb.sys_flag & _COMPRESSED
            self._body = zlib.decompress(raw, _GZIP_OR_ZLIB) if compressed else raw
        return self._body

    @property
    def message_id(self) -> str:
        """The producer's id; for a retried message, the id of the first delivery."""
        return self._pb.properties.get(ORIGIN_MESSAGE_ID_PROPERTY) or self._pb.message_id

    @property
    def tag(self) -> str | None:
        return self._pb.properties.get(_TAGS) or None

    @property
    def keys(self) -> list[str]:
        return [k for k in self._pb.properties.get(_KEYS, "").split(" ") if k]

    @property
    def message_group(self) -> str | None:
        return self._pb.properties.get(_MESSAGE_GROUP) or None

    @property
    def properties(self) -> dict[str, str]:
        """The user's properties (the broker's and RocketMQ's own left out)."""
        return {k: v for k, v in self._pb.properties.items() if k not in _SYSTEM}

    @property
    def system_properties(self) -> dict[str, str]:
        """Every stored property, as the broker keeps them."""
        return dict(self._pb.properties)

    @property
    def reconsume_times(self) -> int:
        """How often this message was consumed before and failed."""
        return self._pb.reconsume_times

    @property
    def born_timestamp_ms(self) -> int:
        return self._pb.born_timestamp_ms

    @property
    def store_timestamp_ms(self) -> int:
        return self._pb.store_timestamp_ms

    @property
    def born_host(self) -> str:
        return self._pb.born_host

    def count_local_retry(self) -> None:
        """The message failed and is consumed again here (its send-back failed)."""
        self._pb.reconsume_times += 1

    @property
    def is_retry(self) -> bool:
        return self.message_queue.topic.startswith(RETRY_PREFIX)

    def __repr__(self) -> str:
        return (
            f"ReceivedMessage({self.message_queue}, offset={self.queue_offset}, "
            f"id={self.message_id!r}, reconsume_times={self.reconsume_times})"
        )
