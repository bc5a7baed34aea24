"""Topic configuration: queue counts, permissions and message type, kept in `topics.json`.

A topic's queue counts decide how many ConsumeQueue directories exist and how producers and
consumers spread over them, so a bad value must be refused when it is set, not discovered when
a queue is opened. `TopicConfig` validates itself on construction; `TopicConfigStore` keeps
the table durable through `JsonConfigTable`. The name and value checks here are shared with
the subscription-group config, which follows the same rules.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capstan.broker.store.atomic_file import JsonConfigTable
from capstan.common.errors import ConfigError

PERM_INHERIT = 1
PERM_WRITE = 2
PERM_READ = 4
DEFAULT_PERM = PERM_READ | PERM_WRITE
_ALL_PERM_BITS = PERM_INHERIT | PERM_WRITE | PERM_READ

MAX_QUEUE_NUMS = 1024
DEFAULT_QUEUE_NUMS = 8
TOPIC_NAME_MAX_CHARS = 127

# RocketMQ's rule; `%` is allowed because system topics such as %RETRY%group and %DLQ%group
# use it.
_NAME_PATTERN = re.compile(r"[A-Za-z0-9_%|-]+")

TOPICS_TABLE_KEY = "topicConfigTable"

CLEANUP_POLICY = "cleanup.policy"
"""Attribute: DELETE (by retention, the default) or COMPACT (the latest record per key;
RocketMQ spells it COMPACTION, accepted too). Case does not matter."""
CLEANUP_POLICIES = frozenset({"DELETE", "COMPACT", "COMPACTION"})


class MessageType(enum.Enum):
    """Which kind of messages a topic accepts; MIXED accepts every kind."""

    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"


def validate_name(name: object, kind: str, max_chars: int) -> str | None:
    """Why `name` is not a valid topic or group name (`kind` says which), or None if it is."""
    if not isinstance(name, str):
        return f"{kind} name must be a string, got {type(name).__name__}"
    if not name:
        return f"{kind} name must not be empty"
    if len(name) > max_chars:
        return f"{kind} name is {len(name)} characters long, at most {max_chars} are allowed"
    if not _NAME_PATTERN.fullmatch(name):
        return f"{kind} name {name!r} may contain only the characters A-Z a-z 0-9 _ % | -"
    return None


def validate_topic_name(name: object) -> str | None:
    """Why `name` is not a valid topic name, or None if it is."""
    return validate_name(name, "topic", TOPIC_NAME_MAX_CHARS)


def check_int(owner: str, field_name: str, value: object, low: int, high: int) -> None:
    """Raise ConfigError naming `field_name` unless `value` is an int in low..high."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(
            f"{owner}: {field_name} must be an integer in {low}..{high}, got {value!r}"
        )


def check_bool(owner: str, field_name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{owner}: {field_name} must be true or false, got {value!r}")


def check_attributes(owner: str, value: object) -> dict[str, str]:
    """A private copy of `value` if it maps strings to strings; ConfigError otherwise."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(f"{owner}: attributes must map strings to strings, got {value!r}")
    return dict(value)


def rename_keys(owner: str, data: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """`data` with its JSON keys replaced by field names; an unknown key is a ConfigError."""
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"{owner}: unknown key {unknown[0]}; known keys: {', '.join(names)}")
    return {names[key]: value for key, value in data.items()}


_TOPIC_JSON_KEYS = {
    "topicName": "name",
    "readQueueNums": "read_queue_nums",
    "writeQueueNums": "write_queue_nums",
    "perm": "perm",
    "messageType": "message_type",
    "attributes": "attributes",
}


@dataclass(frozen=True)
class TopicConfig:
    """One topic. Read and write queue counts differ only while a topic is being resized."""

    name: str
    read_queue_nums: int = DEFAULT_QUEUE_NUMS
    write_queue_nums: int = DEFAULT_QUEUE_NUMS
    perm: int = DEFAULT_PERM
    message_type: MessageType = MessageType.NORMAL
    attributes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = validate_topic_name(self.name)
        if problem is not None:
            raise ConfigError(f"name: {problem}")
        owner = f"topic {self.name}"
        check_int(owner, "read_queue_nums", self.read_queue_nums, 0, MAX_QUEUE_NUMS)
        check_int(owner, "write_queue_nums", self.write_queue_nums, 0, MAX_QUEUE_NUMS)
        if self.read_queue_nums == 0 and self.write_queue_nums == 0:
            raise ConfigError(f"{owner}: read_queue_nums and write_queue_nums are both 0")
        _check_perm(owner, self.perm)
        if not isinstance(self.message_type, MessageType):
            raise ConfigError(f"{owner}: message_type must be a MessageType")
        # A copy, so the caller's dict cannot change a config that is already stored.
        object.__setattr__(self, "attributes", check_attributes(owner, self.attributes))
        policy = self.attributes.get(CLEANUP_POLICY)
        if policy is not None and policy.upper() not in CLEANUP_POLICIES:
            raise ConfigError(
                f"{owner}: attribute {CLEANUP_POLICY} must be DELETE or COMPACT, got {policy!r}"
            )

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def queue_dir_count(self) -> int:
        """Queue directories exist for every read and every write queue."""
        return max(self.read_queue_nums, self.write_queue_nums)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topicName": self.name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "messageType": self.message_type.value,
            "attributes": dict(self.attributes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TopicConfig:
        """The config a `to_dict` result describes; ConfigError names a bad or unknown key."""
        owner = f"topic {data.get('topicName')!r}"
        fields = rename_keys(owner, data, _TOPIC_JSON_KEYS)
        if "name" not in fields:
            raise ConfigError(f"{owner}: topicName is missing")
        if "message_type" in fields:
            fields["message_type"] = _message_type(owner, fields["message_type"])
        return cls(**fields)


def _check_perm(owner: str, perm: object) -> None:
    if isinstance(perm, bool) or not isinstance(perm, int) or perm & ~_ALL_PERM_BITS:
        raise ConfigError(
            f"{owner}: perm may combine only the bits 1 (inherit), 2 (write) and 4 (read),"
            f" got {perm!r}"
        )


def _message_type(owner: str, raw: object) -> MessageType:
    try:
        return MessageType(raw)
    except ValueError:
        names = ", ".join(m.value for m in MessageType)
        raise ConfigError(f"{owner}: messageType {raw!r} is not one of {names}") from None


class TopicConfigStore(JsonConfigTable[TopicConfig]):
    """Every topic of a broker, saved atomically to `path` (typically `topics.json`)."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            path, TOPICS_TABLE_KEY, TopicConfig.to_dict, TopicConfig.from_dict, _topic_name
        )


def _topic_name(config: TopicConfig) -> str:
    return config.name
