"""The producer side of the SDK: sending, queue selection, retries, transactions."""

from capstan.client.producer.producer import Producer
from capstan.client.producer.queue_selectors import (
    ByKeyHash,
    DefaultSelector,
    QueueSelector,
    RoundRobin,
)
from capstan.client.producer.transaction import (
    LocalTransaction,
    TransactionChecker,
    TransactionProducer,
    TransactionResolution,
)

__all__ = [
    "ByKeyHash",
    "DefaultSelector",
    "LocalTransaction",
    "Producer",
    "QueueSelector",
    "RoundRobin",
    "TransactionChecker",
    "TransactionProducer",
    "TransactionResolution",
]
