"""Which queue a keyed message of a compact topic goes to.

Compaction keeps the latest record of each key per queue, so every record of a key must land
in one queue, whoever sends it. The key is the message's keys as the broker stores them (its
KEYS property: the keys joined by one space), and its queue is CRC32 of that key modulo the
writable queues: over every writable queue of the route when a client picks (the SDK, the
CLI), over the broker's own when the broker picks (a client that names no queue, such as the
official ones).

A broker says a topic routes by key with the `KEY_ROUTING_METADATA` trailer on its QueryRoute
answer, and the controller passes it on, since a v2 route has no field for it.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

KEY_ROUTING_METADATA = "x-capstan-key-routing"
"""Trailing metadata of a QueryRoute answer: "keys" when the topic's keyed messages go to
the queue of their key."""

BY_KEYS = "keys"

_STORED_KEY_SEPARATOR = " "
"""How the broker joins a message's keys into its KEYS property."""


def routing_key(keys: Sequence[str]) -> str:
    """The key a compaction groups a message by; "" for a message without keys."""
    return _STORED_KEY_SEPARATOR.join(k for k in keys if k)


def queue_index(key: str, queue_count: int) -> int:
    """The index of `key`'s queue among `queue_count` writable queues."""
    if queue_count <= 0:
        raise ValueError("a topic with no writable queue has no queue for a key")
    return zlib.crc32(key.encode()) % queue_count


def routes_by_key(trailing: Sequence[tuple[str, str | bytes]] | None) -> bool:
    """Whether a QueryRoute answer's trailing metadata says the topic routes by key."""
    return any(k == KEY_ROUTING_METADATA and v == BY_KEYS for k, v in trailing or ())
