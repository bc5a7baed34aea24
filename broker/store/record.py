"""Encode messages into CommitLog records and read them back with every check.

Encoding is split in two: `prepare` does the work that does not depend on where the record
lands (body CRC, topic and properties), so it can run before the append lock is taken;
`finish` fills in offsets and store time under the lock.
"""

from __future__ import annotations

import enum
import functools
import zlib
from dataclasses import dataclass

from capstan.broker.store import format as fmt
from capstan.broker.store.message import Message, StoredMessage, encode_properties

_HEADER = fmt.RECORD_HEADER
_HEADER_BYTES = fmt.RECORD_HEADER_BYTES
_TRAILER_BYTES = fmt.RECORD_TRAILER_BYTES


class RecordProblem(enum.Enum):
    """Why bytes at a position are not a valid record."""

    END_OF_DATA = "no more data (zeros or end of file)"
    BAD_MAGIC = "magic number does not match"
    BAD_SIZE = "size field impossible"
    WRONG_POSITION = "record claims another physical offset"
    BODY_CRC = "body CRC mismatch"
    RECORD_CRC = "record CRC mismatch"
    BAD_LAYOUT = "length fields do not add up"
    TRUNCATED = "record runs past the end of the data"


class RecordTooLarge(ValueError):
    """The message cannot be stored at all (body, topic or properties over a limit)."""


class PropertiesTooLarge(RecordTooLarge):
    """The encoded properties exceed what their 2-byte length can express."""


@dataclass(slots=True)
class PreparedRecord:
    """A message with its position-independent parts already encoded."""

    message: Message
    body_crc: int
    tail: bytes  # topic length, topic, properties length, properties
    size: int


def prepare(message: Message) -> PreparedRecord:
    """Encode what does not depend on the record's position; raise RecordTooLarge."""
    properties = encode_properties(message.properties)
    if len(properties) > fmt.MAX_PROPERTIES_BYTES:
        raise PropertiesTooLarge(
            f"properties are {len(properties)} bytes, over {fmt.MAX_PROPERTIES_BYTES}"
        )
    tail = _topic_field(message.topic) + _PROPERTIES_LENGTH(len(properties)) + properties
    size = _FRAMING_BYTES + len(message.body) + len(tail)
    return PreparedRecord(message, zlib.crc32(message.body), tail, size)


_PROPERTIES_LENGTH = fmt.PROPERTIES_LENGTH.pack
_FRAMING_BYTES = _HEADER_BYTES + _TRAILER_BYTES


@functools.lru_cache(maxsize=1024)
def _topic_field(topic: str) -> bytes:
    """Topic length and topic, as stored; topics repeat, so this is cached."""
    raw = topic.encode()
    if len(raw) > fmt.MAX_TOPIC_BYTES:
        raise RecordTooLarge(f"topic is {len(raw)} bytes, over {fmt.MAX_TOPIC_BYTES}")
    return fmt.TOPIC_LENGTH.pack(len(raw)) + raw


def finish(
    record: PreparedRecord,
    queue_offset: int,
    phys_offset: int,
    store_timestamp_ms: int,
    store_host: bytes,
) -> tuple[bytes, bytes, bytes, bytes]:
    """The record's bytes, as parts to join: header, body, tail, trailer."""
    m = record.message
    header = _HEADER.pack(
        record.size,
        fmt.MESSAGE_MAGIC,
        record.body_crc,
        m.queue_id,
        m.flag,
        queue_offset,
        phys_offset,
        m.sys_flag,
        m.born_timestamp_ms,
        m.born_host,
        store_timestamp_ms,
        store_host,
        m.reconsume_times,
        m.prepared_tx_offset,
        len(m.body),
    )
    record_crc = zlib.crc32(record.tail, zlib.crc32(header, record.body_crc))
    return header, m.body, record.tail, fmt.RECORD_CRC.pack(record_crc)


def blank(size: int) -> bytes:
    """The filler that ends a segment: `size` is the number of bytes left in it."""
    return fmt.BLANK_RECORD.pack(size, fmt.BLANK_MAGIC)


def check_at(
    buf: bytes | memoryview, pos: int, phys_offset: int, verify_crc: bool = True
) -> tuple[int, RecordProblem | None, bool]:
    """Validate the record at `buf[pos:]`, which should sit at `phys_offset`.

    Returns (size, problem, is_blank). `size` is meaningful only when problem is None.
    """
    if len(buf) - pos < fmt.BLANK_RECORD_BYTES:
        return 0, RecordProblem.END_OF_DATA, False
    size, magic = fmt.SIZE_AND_MAGIC.unpack_from(buf, pos)
    if size == 0 and magic == 0:
        return 0, RecordProblem.END_OF_DATA, False
    if magic == fmt.BLANK_MAGIC:
        if size < fmt.BLANK_RECORD_BYTES:
            return 0, RecordProblem.BAD_SIZE, False
        return size, None, True
    if magic != fmt.MESSAGE_MAGIC:
        return 0, RecordProblem.BAD_MAGIC, False
    if size < _HEADER_BYTES + 4 + _TRAILER_BYTES:
        return 0, RecordProblem.BAD_SIZE, False
    if pos + size > len(buf):
        return 0, RecordProblem.TRUNCATED, False
    return _check_full(buf, pos, size, phys_offset, verify_crc)


def _check_full(
    buf: bytes | memoryview, pos: int, size: int, phys_offset: int, verify_crc: bool
) -> tuple[int, RecordProblem | None, bool]:
    header = _HEADER.unpack_from(buf, pos)
    if header[6] != phys_offset:
        return 0, RecordProblem.WRONG_POSITION, False
    body_len = header[14]
    body_end = pos + _HEADER_BYTES + body_len
    end = pos + size - _TRAILER_BYTES
    if body_len < 0 or body_end + 4 > end:
        return 0, RecordProblem.BAD_LAYOUT, False
    topic_len = fmt.TOPIC_LENGTH.unpack_from(buf, body_end)[0]
    props_at = body_end + 2 + topic_len
    if props_at + 2 > end:
        return 0, RecordProblem.BAD_LAYOUT, False
    if props_at + 2 + fmt.PROPERTIES_LENGTH.unpack_from(buf, props_at)[0] != end:
        return 0, RecordProblem.BAD_LAYOUT, False
    if verify_crc:
        body_crc = zlib.crc32(buf[pos + _HEADER_BYTES : body_end])
        if body_crc != header[2]:
            return 0, RecordProblem.BODY_CRC, False
        expected = fmt.RECORD_CRC.unpack_from(buf, end)[0]
        crc = zlib.crc32(buf[body_end:end], zlib.crc32(buf[pos : pos + _HEADER_BYTES], body_crc))
        if crc != expected:
            return 0, RecordProblem.RECORD_CRC, False
    return size, None, False


def decode(buf: bytes | memoryview, pos: int = 0, verify_crc: bool = True) -> StoredMessage:
    """Decode the (already framed) record at `buf[pos:]`; raise CorruptRecord on a bad CRC."""
    header = _HEADER.unpack_from(buf, pos)
    size = header[0]
    body_at = pos + _HEADER_BYTES
    body_end = body_at + header[14]
    body = bytes(buf[body_at:body_end])
    if verify_crc and zlib.crc32(body) != header[2]:
        raise CorruptRecord(header[6], RecordProblem.BODY_CRC)
    topic_len = fmt.TOPIC_LENGTH.unpack_from(buf, body_end)[0]
    topic_end = body_end + 2 + topic_len
    topic = bytes(buf[body_end + 2 : topic_end]).decode()
    props = bytes(buf[topic_end + 2 : pos + size - _TRAILER_BYTES])
    return StoredMessage(header, body, topic, props)


class CorruptRecord(Exception):
    """A record failed its checks when read back."""

    def __init__(self, phys_offset: int, problem: RecordProblem) -> None:
        super().__init__(f"record at physical offset {phys_offset}: {problem.value}")
        self.phys_offset = phys_offset
        self.problem = problem
