"""Names of the topics the broker keeps for itself, and the retry back-off levels."""

from __future__ import annotations

from typing import Final

from capstan.broker.store.topic_config import PERM_READ, PERM_WRITE, TopicConfig

TIMER_TOPIC: Final = "SCHEDULE_TOPIC_XXXX"
"""Delayed messages wait here, one queue, until the timer delivers them."""

HALF_TOPIC: Final = "RMQ_SYS_TRANS_HALF_TOPIC"
"""Transactional messages before their producer commits or rolls back."""

OP_TOPIC: Final = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
"""One record per decided half message (the body is the half message's queue offset)."""

CHECK_MAX_TOPIC: Final = "TRANS_CHECK_MAX_TIME_TOPIC"
"""Half messages whose producer never answered within the allowed number of checks."""

RETRY_PREFIX: Final = "%RETRY%"
DLQ_PREFIX: Final = "%DLQ%"

SYSTEM_TOPICS: Final = (TIMER_TOPIC, HALF_TOPIC, OP_TOPIC, CHECK_MAX_TOPIC)

DELAY_LEVELS_MS: Final = tuple(
    s * 1000
    for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
"""RocketMQ's 18 delay levels (1s 5s 10s 30s 1m … 2h); level n waits DELAY_LEVELS_MS[n-1]."""


def retry_topic(group: str) -> str:
    return f"{RETRY_PREFIX}{group}"


def dlq_topic(group: str) -> str:
    return f"{DLQ_PREFIX}{group}"


def is_system_topic(name: str) -> bool:
    return name in SYSTEM_TOPICS


def is_group_topic(name: str) -> bool:
    """Retry and dead-letter topics belong to a consumer group."""
    return name.startswith((RETRY_PREFIX, DLQ_PREFIX))


def system_topic_configs() -> list[TopicConfig]:
    """The broker's own topics, created when it starts."""
    rw = PERM_READ | PERM_WRITE
    return [TopicConfig(name, 1, 1, rw) for name in SYSTEM_TOPICS]


def group_topic_config(name: str) -> TopicConfig:
    """A retry or dead-letter topic: one queue, readable so people can inspect it."""
    return TopicConfig(name, 1, 1, PERM_READ | PERM_WRITE)
