"""Messages as the SDK's users see them: what they send, what a send returns, and a
message as the broker shows it back."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field


class MessageType(enum.Enum):
    """The kinds of message a topic may accept (the v2 protocol's MessageType)."""

    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"


@dataclass(slots=True)
class Message:
    """A message to send. Checked when built (and again when sent), so a mistake surfaces
    where it was made: an empty topic or body, a non-bytes body, a blank tag or key, or a
    message that is both FIFO and delayed raise ValueError / TypeError.

    The kind of message follows from its fields: `message_group` makes it FIFO (every
    message of a group lands on one queue, in order), `delivery_timestamp_ms` makes it a
    delay message (delivered at that time, epoch milliseconds); a message cannot be both.
    """

    topic: str
    body: bytes
    tag: str | None = None
    """One tag consumers can filter on; no '|' (it separates tags in filter expressions)."""
    keys: list[str] = field(default_factory=list)
    """Business keys the broker indexes, to look a message up by."""
    properties: dict[str, str] = field(default_factory=dict)
    """User properties, carried to consumers as they are."""
    message_group: str | None = None
    delivery_timestamp_ms: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError (or TypeError for a wrong type) naming what is wrong."""
        topic: object = self.topic
        body: object = self.body
        if not isinstance(topic, str) or not topic.strip():
            raise ValueError("a message needs a topic (a non-empty string)")
        if not isinstance(body, bytes):
            raise TypeError(f"body must be bytes, got {type(body).__name__} (encode it)")
        if not body:
            raise ValueError("a message needs a non-empty body")
        if self.tag is not None and (not self.tag.strip() or "|" in self.tag):
            raise ValueError(f"tag {self.tag!r} must be non-blank and may not contain '|'")
        keys: list[object] = list(self.keys)
        for key in keys:
            if not isinstance(key, str) or not key.strip() or any(c.isspace() for c in key):
                raise ValueError(f"key {key!r} must be a non-blank string without whitespace")
        properties: list[tuple[object, object]] = list(self.properties.items())
        for name, value in properties:
            if not isinstance(name, str) or not name or not isinstance(value, str):
                raise ValueError(f"property {name!r}: names and values must be strings")
        if self.message_group is not None and not self.message_group.strip():
            raise ValueError("message_group must be non-blank when given")
        if self.delivery_timestamp_ms is not None and self.delivery_timestamp_ms < 0:
            raise ValueError("delivery_timestamp_ms must be epoch milliseconds (>= 0)")
        if self.message_group is not None and self.delivery_timestamp_ms is not None:
            raise ValueError("a message is either FIFO (message_group) or delayed, not both")

    @property
    def message_type(self) -> MessageType:
        """FIFO with a message group, DELAY with a delivery time, else NORMAL (a
        transactional producer sends it as TRANSACTION instead)."""
        if self.message_group is not None:
            return MessageType.FIFO
        if self.delivery_timestamp_ms is not None:
            return MessageType.DELAY
        return MessageType.NORMAL


@dataclass(frozen=True, slots=True)
class SendReceipt:
    """What the broker answered for one stored message."""

    message_id: str
    topic: str
    broker_name: str
    """The broker group that stored it."""
    queue_id: int | None
    """The queue it was stored in, when the broker says so (a broker honouring the
    producer's queue choice does; otherwise None: the broker picked a queue itself)."""
    offset: int
    """Its offset in that queue (for a delay or half message: in the broker's holding queue)."""
    transaction_id: str | None = None
    """Set for a transactional (half) message: what EndTransaction names it by."""


@dataclass(frozen=True, slots=True)
class MessageView:
    """A stored message as a broker shows it to a client (e.g. in a transaction check-back)."""

    message_id: str
    topic: str
    body: bytes
    tag: str | None = None
    keys: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    message_group: str | None = None
    delivery_timestamp_ms: int | None = None
    born_timestamp_ms: int = 0
    born_host: str = ""
