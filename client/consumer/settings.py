"""The consumer's options, listener types and the enums users pass (RocketMQ's names)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capstan.client.consumer import allocation
from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.received_message import ReceivedMessage


class MessageModel(enum.Enum):
    CLUSTERING = 1
    """Each message goes to one member; members share the queues."""
    BROADCASTING = 2
    """Every member gets every message; each keeps its offsets in a local file."""


class ConsumeFromWhere(enum.Enum):
    """Where a group starts on a queue it has no committed offset for."""

    LAST_OFFSET = "last"
    """Only messages stored from now on (the retry topic still starts at its first)."""
    FIRST_OFFSET = "first"
    """Every message still stored."""
    TIMESTAMP = "timestamp"
    """Messages stored at or after `consume_timestamp_ms`."""


class ConsumeStatus(enum.Enum):
    CONSUME_SUCCESS = "success"
    RECONSUME_LATER = "later"
    """Concurrent: the batch failed; send the failed part back for a later retry."""
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "suspend"
    """Orderly: the batch failed; stop this queue a moment and consume it again, in order."""


@dataclass
class ConsumeContext:
    """What a listener may read and set about the batch it is given."""

    message_queue: MessageQueue
    ack_index: int
    """Concurrent: messages up to this index succeeded (default: all of them when the
    status is CONSUME_SUCCESS); those after it are sent back for retry."""
    delay_level_when_next_consume: int = 0
    """Concurrent: retry delay level for the failed ones; 0 lets the broker choose
    (3 + reconsume times), -1 sends them straight to the dead-letter queue."""
    suspend_ms: int = -1
    """Orderly: how long SUSPEND_CURRENT_QUEUE_A_MOMENT pauses; -1 keeps the default."""


Listener = Callable[[Sequence[ReceivedMessage], ConsumeContext], ConsumeStatus]

Allocator = Callable[
    [Sequence[MessageQueue], Sequence[str], dict[MessageQueue, str]], dict[str, list[MessageQueue]]
]


def _averagely(q: Sequence[MessageQueue], c: Sequence[str], _: dict[MessageQueue, str]) -> Any:
    return allocation.allocate_averagely(q, c)


def _by_circle(q: Sequence[MessageQueue], c: Sequence[str], _: dict[MessageQueue, str]) -> Any:
    return allocation.allocate_averagely_by_circle(q, c)


def _consistent_hash(
    q: Sequence[MessageQueue], c: Sequence[str], _: dict[MessageQueue, str]
) -> Any:
    return allocation.allocate_consistent_hash(q, c)


def _sticky(q: Sequence[MessageQueue], c: Sequence[str], prev: dict[MessageQueue, str]) -> Any:
    return allocation.allocate_sticky(q, c, prev)


ALLOCATION_STRATEGIES: dict[str, Allocator] = {
    "averagely": _averagely,
    "averagely_by_circle": _by_circle,
    "consistent_hash": _consistent_hash,
    "sticky": _sticky,
}


@dataclass(frozen=True)
class ConsumerOptions:
    """Defaults are RocketMQ's DefaultMQPushConsumer's unless said otherwise."""

    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET
    consume_timestamp_ms: int = 0
    allocation: str = "averagely"
    """averagely, averagely_by_circle, consistent_hash or sticky."""
    consume_thread_count: int = 20
    consume_message_batch_max_size: int = 1
    pull_batch_size: int = 32
    pull_threshold_for_queue: int = 1000
    """Cached messages of one queue past which pulling it pauses 50 ms."""
    pull_threshold_size_for_queue_mib: int = 100
    consume_concurrently_max_span: int = 2000
    """Concurrent: highest minus lowest cached offset past which pulling pauses."""
    max_reconsume_times: int = 16
    suspend_current_queue_time_ms: int = 1000
    long_polling_ms: int = 15_000
    rebalance_interval_s: float = 20.0
    heartbeat_interval_s: float = 5.0
    persist_offset_interval_s: float = 5.0
    lock_renew_interval_s: float = 20.0
    offset_file: Path | None = None
    """Broadcasting: where offsets are kept (default ~/.capstan/offsets/<group>.json)."""
    route_refresh_s: float = 30.0

    def __post_init__(self) -> None:
        if self.allocation not in ALLOCATION_STRATEGIES:
            names = ", ".join(ALLOCATION_STRATEGIES)
            raise ValueError(f"allocation must be one of {names}, not {self.allocation!r}")
        positive = {
            "consume_thread_count": self.consume_thread_count,
            "consume_message_batch_max_size": self.consume_message_batch_max_size,
            "pull_threshold_for_queue": self.pull_threshold_for_queue,
            "pull_threshold_size_for_queue_mib": self.pull_threshold_size_for_queue_mib,
            "consume_concurrently_max_span": self.consume_concurrently_max_span,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be positive, not {value}")
        if not 1 <= self.pull_batch_size <= 1024:
            raise ValueError(f"pull_batch_size must be 1..1024, not {self.pull_batch_size}")
        if not 0 <= self.max_reconsume_times <= 64:
            raise ValueError("max_reconsume_times must be 0..64")
        if self.consume_from_where is ConsumeFromWhere.TIMESTAMP and self.consume_timestamp_ms <= 0:
            raise ValueError("consume_from_where TIMESTAMP needs consume_timestamp_ms")
