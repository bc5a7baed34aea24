"""Messages going into the store and coming out of it, and the property codec.

Properties travel as `name\\x01value\\x02` pairs (RocketMQ's encoding); names and values
therefore may not contain the bytes 1 or 2.
"""

from __future__ import annotations

import functools
import ipaddress
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from capstan.broker.store import format as fmt
from capstan.broker.store.properties import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_UNIQ_KEY,
)

# sys_flag bits (RocketMQ's MessageSysFlag values).
SYSFLAG_COMPRESSED: Final = 0x1
SYSFLAG_MULTI_TAGS: Final = 0x2
SYSFLAG_TRANSACTION_MASK: Final = 0xC
SYSFLAG_TRANSACTION_PREPARED: Final = 0x4
SYSFLAG_TRANSACTION_COMMIT: Final = 0x8
SYSFLAG_TRANSACTION_ROLLBACK: Final = 0xC

_NAME_VALUE = "\x01"
_PAIR_END = "\x02"
_PORT = struct.Struct(">I")


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Encode properties as name\\x01value\\x02 pairs; raise ValueError on a separator byte."""
    if not properties:
        return b""
    text = "".join([f"{k}\x01{v}\x02" for k, v in properties.items()])
    if text.count(_NAME_VALUE) != len(properties) or text.count(_PAIR_END) != len(properties):
        raise ValueError("property names and values may not contain the bytes 0x01 or 0x02")
    return text.encode()


def decode_properties(raw: bytes) -> dict[str, str]:
    """Decode what `encode_properties` wrote."""
    if not raw:
        return {}
    return dict([pair.split(_NAME_VALUE, 1) for pair in raw.decode().split(_PAIR_END) if pair])


@functools.lru_cache(maxsize=1024)
def pack_host(host: str, port: int) -> bytes:
    """A 20-byte address: 16-byte IPv6 (IPv4 mapped into it) and a 4-byte port."""
    address = ipaddress.ip_address(host)
    if isinstance(address, ipaddress.IPv4Address):
        address = ipaddress.IPv6Address(f"::ffff:{address}")
    return address.packed + _PORT.pack(port)


@functools.lru_cache(maxsize=1024)
def unpack_host(raw: bytes) -> tuple[str, int]:
    """The (host, port) that `pack_host` packed."""
    address = ipaddress.IPv6Address(raw[:16])
    port = _PORT.unpack_from(raw, 16)[0]
    mapped = address.ipv4_mapped
    return (str(mapped) if mapped is not None else str(address), port)


LOCALHOST: Final = pack_host("127.0.0.1", 0)


@dataclass(slots=True)
class Message:
    """A message to append: what a producer sent plus the queue the broker chose."""

    topic: str
    queue_id: int
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: bytes = LOCALHOST
    reconsume_times: int = 0
    prepared_tx_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def is_prepared_transaction(self) -> bool:
        """Half messages are stored but not dispatched to consumers until committed."""
        return self.sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_PREPARED

    @property
    def keys(self) -> list[str]:
        """The message's KEYS (the index also looks it up by its message id)."""
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]


class StoredMessage:
    """A message read back from the CommitLog; properties are decoded on first use."""

    __slots__ = (
        "_properties",
        "body",
        "body_crc",
        "born_host",
        "born_timestamp_ms",
        "flag",
        "phys_offset",
        "prepared_tx_offset",
        "properties_raw",
        "queue_id",
        "queue_offset",
        "reconsume_times",
        "size",
        "store_host",
        "store_timestamp_ms",
        "sys_flag",
        "topic",
    )
    size: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    phys_offset: int
    sys_flag: int
    born_timestamp_ms: int
    born_host: bytes
    store_timestamp_ms: int
    store_host: bytes
    reconsume_times: int
    prepared_tx_offset: int

    def __init__(
        self,
        header: tuple[Any, ...],
        body: bytes,
        topic: str,
        properties_raw: bytes,
    ) -> None:
        (
            self.size,
            _magic,
            self.body_crc,
            self.queue_id,
            self.flag,
            self.queue_offset,
            self.phys_offset,
            self.sys_flag,
            self.born_timestamp_ms,
            self.born_host,
            self.store_timestamp_ms,
            self.store_host,
            self.reconsume_times,
            self.prepared_tx_offset,
            _body_length,
        ) = header
        self.body = body
        self.topic = topic
        self.properties_raw = properties_raw
        self._properties: dict[str, str] | None = None

    @property
    def properties(self) -> dict[str, str]:
        if self._properties is None:
            self._properties = decode_properties(self.properties_raw)
        return self._properties

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return [k for k in self.properties.get(PROPERTY_KEYS, "").split(KEY_SEPARATOR) if k]

    @property
    def msg_id(self) -> str | None:
        """The producer's message id (RocketMQ's UNIQ_KEY), if it set one."""
        return self.properties.get(PROPERTY_UNIQ_KEY)

    @property
    def offset_msg_id(self) -> str:
        """The broker's id for this record: store host and physical offset, in hex."""
        return offset_msg_id(self.store_host, self.phys_offset)

    def __repr__(self) -> str:
        return (
            f"StoredMessage(topic={self.topic!r}, queue_id={self.queue_id}, "
            f"queue_offset={self.queue_offset}, phys_offset={self.phys_offset}, "
            f"body={len(self.body)} bytes)"
        )


def offset_msg_id(store_host: bytes, phys_offset: int) -> str:
    """Store host (20 bytes) and physical offset (8 bytes) as 56 hex digits."""
    return (store_host + phys_offset.to_bytes(8, "big")).hex().upper()


def phys_offset_of_msg_id(msg_id: str) -> int | None:
    """The physical offset inside an offset message id, or None if it is not one."""
    if len(msg_id) != 56:
        return None
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        return None
    return int.from_bytes(raw[20:], "big")


@functools.lru_cache(maxsize=4096)
def tag_hash(tags: str | None) -> int:
    """The tag hash kept in consume-queue units so filters can skip without reading the log."""
    if not tags:
        return 0
    return fmt.crc32(tags.encode())


def queue_tag_code(properties: Mapping[str, str]) -> int:
    """The 8-byte code a consume-queue unit carries: the delivery time for timer messages,
    otherwise the tag hash."""
    deliver_ms = properties.get(PROPERTY_TIMER_DELIVER_MS)
    if deliver_ms is not None and deliver_ms.isdigit():
        return int(deliver_ms)
    return tag_hash(properties.get(PROPERTY_TAGS))
