"""Consumer-group configuration: may it consume, how often to retry, FIFO or not.

The broker consults this on every pull and every failed delivery (retry count, retry queue
count), so like topics it is validated when set and kept durable in one file
(`subscriptionGroup.json` in RocketMQ) through `JsonConfigTable`. Group names follow the topic
name rule but may be longer, as in RocketMQ.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capstan.broker.store.atomic_file import JsonConfigTable
from capstan.broker.store.topic_config import (
    MAX_QUEUE_NUMS,
    check_attributes,
    check_bool,
    check_int,
    rename_keys,
    validate_name,
)
from capstan.common.errors import ConfigError

GROUP_NAME_MAX_CHARS = 255
MAX_RETRY_TIMES = 64
DEFAULT_RETRY_TIMES = 16

GROUPS_TABLE_KEY = "subscriptionGroupTable"

_GROUP_JSON_KEYS = {
    "groupName": "group_name",
    "consumeEnable": "consume_enable",
    "consumeBroadcastEnable": "consume_broadcast_enable",
    "retryMaxTimes": "retry_max_times",
    "consumeMessageOrderly": "consume_message_orderly",
    "retryQueueNums": "retry_queue_nums",
    "attributes": "attributes",
}


def validate_group_name(name: object) -> str | None:
    """Why `name` is not a valid consumer-group name, or None if it is."""
    return validate_name(name, "group", GROUP_NAME_MAX_CHARS)


@dataclass(frozen=True)
class SubscriptionGroupConfig:
    """One consumer group. `consume_message_orderly` marks a FIFO group."""

    group_name: str
    consume_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_max_times: int = DEFAULT_RETRY_TIMES
    consume_message_orderly: bool = False
    retry_queue_nums: int = 1
    attributes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = validate_group_name(self.group_name)
        if problem is not None:
            raise ConfigError(f"group_name: {problem}")
        owner = f"group {self.group_name}"
        check_bool(owner, "consume_enable", self.consume_enable)
        check_bool(owner, "consume_broadcast_enable", self.consume_broadcast_enable)
        check_bool(owner, "consume_message_orderly", self.consume_message_orderly)
        check_int(owner, "retry_max_times", self.retry_max_times, 0, MAX_RETRY_TIMES)
        # A retry topic needs at least one queue, or failed messages would have nowhere to go.
        check_int(owner, "retry_queue_nums", self.retry_queue_nums, 1, MAX_QUEUE_NUMS)
        # A copy, so the caller's dict cannot change a config that is already stored.
        object.__setattr__(self, "attributes", check_attributes(owner, self.attributes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "groupName": self.group_name,
            "consumeEnable": self.consume_enable,
            "consumeBroadcastEnable": self.consume_broadcast_enable,
            "retryMaxTimes": self.retry_max_times,
            "consumeMessageOrderly": self.consume_message_orderly,
            "retryQueueNums": self.retry_queue_nums,
            "attributes": dict(self.attributes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SubscriptionGroupConfig:
        """The config a `to_dict` result describes; ConfigError names a bad or unknown key."""
        owner = f"group {data.get('groupName')!r}"
        fields = rename_keys(owner, data, _GROUP_JSON_KEYS)
        if "group_name" not in fields:
            raise ConfigError(f"{owner}: groupName is missing")
        return cls(**fields)


class SubscriptionGroupStore(JsonConfigTable[SubscriptionGroupConfig]):
    """Every consumer group of a broker, saved atomically to `path`."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            path,
            GROUPS_TABLE_KEY,
            SubscriptionGroupConfig.to_dict,
            SubscriptionGroupConfig.from_dict,
            _group_name,
        )


def _group_name(config: SubscriptionGroupConfig) -> str:
    return config.group_name
