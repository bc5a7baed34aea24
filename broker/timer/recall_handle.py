"""Recall handles: what a producer gets back for a delayed message, to cancel it with
RecallMessage while it still waits in the timer.

A handle names the parked copy's offset in the timer queue, its delivery time and the
message id, with a keyed tag over them and the topic (the receipt-handle key, which slaves
share, so a handle outlives a restart and a failover). One that does not carry a matching
tag was not issued by this broker group for this topic.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from capstan.broker.pop.receipt_handle import HandleCodec

_VERSION = "r1"
_SCOPE = "recall"
_BODY_PARTS = 4  # version, offset, delivery time, message id (the tag follows the body)


@dataclass(frozen=True, slots=True)
class RecallHandle:
    timer_offset: int
    """Where the parked copy sits in the timer queue."""
    deliver_at_ms: int
    message_id: str


def encode(codec: HandleCodec, topic: str, handle: RecallHandle) -> str:
    body = f"{_VERSION}.{handle.timer_offset:x}.{handle.deliver_at_ms:x}.{handle.message_id}"
    return f"{body}.{codec.tag(_SCOPE, topic, body)}"


def decode(codec: HandleCodec, topic: str, text: str) -> RecallHandle | None:
    """The handle, or None if it is malformed or was not issued for `topic` here."""
    body, _, tag = text.rpartition(".")
    parts = body.split(".", 3)
    if len(parts) != _BODY_PARTS or parts[0] != _VERSION or not parts[3]:
        return None
    if not hmac.compare_digest(tag.encode(), codec.tag(_SCOPE, topic, body).encode()):
        return None
    try:
        return RecallHandle(int(parts[1], 16), int(parts[2], 16), parts[3])
    except ValueError:
        return None
