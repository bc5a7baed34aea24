"""Outcomes of store operations: expected results are enums, not exceptions."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import NamedTuple

from capstan.broker.store.message import StoredMessage


class PutStatus(enum.Enum):
    """The outcome of an append (names after RocketMQ's PutMessageStatus)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    """Written, but fsync did not complete within flush_disk_timeout_ms."""
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    """The batch is empty, or a record does not encode or cannot fit a segment."""
    MESSAGE_BODY_EMPTY = "MESSAGE_BODY_EMPTY"
    """A message has no body (RocketMQ counts it MESSAGE_ILLEGAL)."""
    MESSAGE_BODY_TOO_LARGE = "MESSAGE_BODY_TOO_LARGE"
    """A body is over the limit: max_message_bytes, or a client-facing one below it
    (RocketMQ counts it MESSAGE_ILLEGAL)."""
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    TOPIC_NOT_EXIST = "TOPIC_NOT_EXIST"
    QUEUE_NOT_EXIST = "QUEUE_NOT_EXIST"
    """The queue id is negative or not below the topic's writeQueueNums."""
    NOT_WRITEABLE = "NOT_WRITEABLE"
    """The topic's permission does not allow writes."""
    DISK_FULL = "DISK_FULL"
    """The disk (or file-size limit) is full; nothing was written. Retry after space returns."""
    IO_ERROR = "IO_ERROR"
    """A write or fsync failed; after an fsync failure the store refuses writes until
    restarted, because what is on disk is no longer known."""
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    """The store is closing or has failed."""
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    """Stored on the master, but the copies it needs did not acknowledge in time."""
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"
    """Refused before storing: too few replicas are in sync for the copies a write needs."""
    NOT_MASTER = "NOT_MASTER"
    """Refused: this broker is a slave (or a deposed master) of its group."""

    @property
    def ok(self) -> bool:
        return self is PutStatus.PUT_OK

    @property
    def retriable(self) -> bool:
        """Whether sending the same message again may succeed."""
        return self in _RETRIABLE_PUT


_RETRIABLE_PUT = {
    PutStatus.FLUSH_DISK_TIMEOUT,
    PutStatus.DISK_FULL,
    PutStatus.SERVICE_NOT_AVAILABLE,
}


class AppendedMessage(NamedTuple):
    """Where one appended message landed (a tuple: one is made per message stored)."""

    queue_offset: int
    phys_offset: int
    size: int


@dataclass(frozen=True, slots=True)
class PutResult:
    status: PutStatus
    appended: list[AppendedMessage] = field(default_factory=list)
    store_timestamp_ms: int = 0
    detail: str = ""


class GetStatus(enum.Enum):
    """The outcome of a read from a consume queue (names after RocketMQ's GetMessageStatus)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    """Messages were scanned but none passed the tag filter (or all were unreadable)."""
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    """The messages were deleted by retention while being read."""
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    """Below the queue's minimum (retention removed it); restart at next_begin_offset."""
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    """Exactly at the end: no new message yet."""
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    """Past the end."""
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    """No such topic or queue."""


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    messages: list[StoredMessage]
    next_begin_offset: int
    min_offset: int
    max_offset: int
    unreadable_offsets: list[int] = field(default_factory=list)
    """Queue offsets skipped because their record failed its checks or was lost."""
