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
    size, problem, message = parse_at(buf, pos, phys_offset, verify_crc)
    return size, problem, problem is None and message is None


def parse_at(
    buf: bytes | memoryview, pos: int, phys_offset: int, verify_crc: bool = True
) -> tuple[int, RecordProblem | None, StoredMessage | None]:
    """Validate and decode the record at `buf[pos:]` in one pass.

    Returns (size, problem, message): a blank filler gives (size, None, None); a valid
    message record gives (size, None, message); anything else (0, problem, None).
    """
    available = len(buf) - pos
    if available < fmt.BLANK_RECORD_BYTES:
        return 0, RecordProblem.END_OF_DATA, None
    size, magic = _SIZE_AND_MAGIC(buf, pos)
    if magic != fmt.MESSAGE_MAGIC:
        return _not_a_message(size, magic)
    if size < _MIN_RECORD_BYTES:
        return 0, RecordProblem.BAD_SIZE, None
    if size > available:
        return 0, RecordProblem.TRUNCATED, None
    header = _HEADER.unpack_from(buf, pos)
    if header[6] != phys_offset:
        return 0, RecordProblem.WRONG_POSITION, None
    body_at = pos + _HEADER_BYTES
    body_end = body_at + header[14]
    end = pos + size - _TRAILER_BYTES
    if header[14] < 0 or body_end + 4 > end:
        return 0, RecordProblem.BAD_LAYOUT, None
    body = bytes(buf[body_at:body_end])
    tail = bytes(buf[body_end:end])
    topic_end = 2 + (tail[0] << 8 | tail[1])
    if topic_end + 2 > len(tail) or topic_end + 2 + (
        tail[topic_end] << 8 | tail[topic_end + 1]
    ) != len(tail):
        return 0, RecordProblem.BAD_LAYOUT, None
    if verify_crc:
        problem = _crc_problem(buf, pos, body, tail, header[2], end)
        if problem is not None:
            return 0, problem, None
    try:
        topic = tail[2:topic_end].decode()
    except UnicodeDecodeError:
        return 0, RecordProblem.BAD_LAYOUT, None
    return size, None, StoredMessage(header, body, topic, tail[topic_end + 2 :])


_SIZE_AND_MAGIC = fmt.SIZE_AND_MAGIC.unpack_from
_MIN_RECORD_BYTES = _HEADER_BYTES + 4 + _TRAILER_BYTES


def _not_a_message(size: int, magic: int) -> tuple[int, RecordProblem | None, None]:
    if magic == fmt.BLANK_MAGIC:
        if size < fmt.BLANK_RECORD_BYTES:
            return 0, RecordProblem.BAD_SIZE, None
        return size, None, None
    if size == 0 and magic == 0:
        return 0, RecordProblem.END_OF_DATA, None
    return 0, RecordProblem.BAD_MAGIC, None


def _crc_problem(
    buf: bytes | memoryview, pos: int, body: bytes, tail: bytes, body_crc: int, end: int
) -> RecordProblem | None:
    if zlib.crc32(body) != body_crc:
        return RecordProblem.BODY_CRC
    header_crc = zlib.crc32(buf[pos : pos + _HEADER_BYTES], body_crc)
    if zlib.crc32(tail, header_crc) != fmt.RECORD_CRC.unpack_from(buf, end)[0]:
        return RecordProblem.RECORD_CRC
    return None


def decode(buf: bytes | memoryview, pos: int = 0, verify_crc: bool = True) -> StoredMessage:
    """Decode the record at `buf[pos:]`, trusting its framing; CorruptRecord if it is bad."""
    phys = int.from_bytes(
        buf[pos + fmt.PHYS_OFFSET_FIELD_AT : pos + fmt.PHYS_OFFSET_FIELD_AT + 8], "big"
    )
    _, problem, message = parse_at(buf, pos, phys, verify_crc)
    if problem is not None or message is None:
        raise CorruptRecord(phys, problem or RecordProblem.BAD_MAGIC)
    return message


class CorruptRecord(Exception):
    """A record failed its checks when read back."""

    def __init__(self, phys_offset: int, problem: RecordProblem) -> None:
        super().__init__(f"record at physical offset {phys_offset}: {problem.value}")
        self.phys_offset = phys_offset
        self.problem = problem
