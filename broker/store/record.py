"""Encode messages into CommitLog records and read them back with every check.

Encoding is split in two: `prepare` does the work that does not depend on where the record
lands (topic and properties), so it can run before the append lock is taken; `finish`
fills in offsets and store time under the lock, and the CRCs, as a record of its own, or
`finish_batch` as the entries of one batch record.
"""

from __future__ import annotations

import enum
import functools
import struct
import zlib
from collections.abc import Container, Sequence
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
    tail: bytes  # topic length, topic, properties length, properties
    size: int  # as a record of its own
    properties_at: int  # where in `tail` the properties' length starts

    @property
    def entry_size(self) -> int:
        """Its size as an entry of a batch record."""
        return _ENTRY_HEADER_BYTES + len(self.message.body) + len(self.tail) - self.properties_at


def prepare(message: Message) -> PreparedRecord:
    """Encode what does not depend on the record's position; raise RecordTooLarge."""
    properties = encode_properties(message.properties)
    if len(properties) > fmt.MAX_PROPERTIES_BYTES:
        raise PropertiesTooLarge(
            f"properties are {len(properties)} bytes, over {fmt.MAX_PROPERTIES_BYTES}"
        )
    topic_field = _topic_field(message.topic)
    tail = topic_field + _PROPERTIES_LENGTH(len(properties)) + properties
    size = _FRAMING_BYTES + len(message.body) + len(tail)
    return PreparedRecord(message, tail, size, len(topic_field))


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
    """The record's bytes, as parts to join: header, body, tail, trailer. (The body's CRC
    is taken here, not in `prepare`: an entry of a batch record has none of its own.)"""
    m = record.message
    body_crc = zlib.crc32(m.body)
    header = _HEADER.pack(
        record.size,
        fmt.MESSAGE_MAGIC,
        body_crc,
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
    record_crc = zlib.crc32(record.tail, zlib.crc32(header, body_crc))
    return header, m.body, record.tail, fmt.RECORD_CRC.pack(record_crc)


# -- batch records (format.py: "CommitLog batch record") ---------------------------------

_BATCH_HEADER = fmt.BATCH_HEADER
_BATCH_HEADER_BYTES = fmt.BATCH_HEADER_BYTES
_BATCH_HEAD_AFTER_CRC = fmt.BATCH_HEAD_AFTER_CRC
_ENTRY_HEADER = fmt.ENTRY_HEADER
_ENTRY_HEADER_BYTES = fmt.ENTRY_HEADER_BYTES
_SIZE_MAGIC_CRC = struct.Struct(">iII")
_MIN_BATCH_BYTES = _BATCH_HEADER_BYTES + 2 + _ENTRY_HEADER_BYTES


def framed(size: int, magic: int) -> bool:
    """Whether a size and magic can start a record that holds messages (a message record
    or a batch record): what lets a reader step to the next record."""
    if magic == fmt.MESSAGE_MAGIC:
        return size > _HEADER_BYTES
    return magic == fmt.BATCH_MAGIC and size >= _MIN_BATCH_BYTES


def batch_size(records: Sequence[PreparedRecord]) -> int:
    """The size of the batch record `records` would make (all of one topic and queue)."""
    topic_bytes = records[0].properties_at
    return _BATCH_HEADER_BYTES + topic_bytes + sum(r.entry_size for r in records)


def finish_batch(
    records: Sequence[PreparedRecord],
    first_queue_offset: int,
    phys_offset: int,
    store_timestamp_ms: int,
    store_host: bytes,
) -> tuple[list[bytes], list[int], list[int]]:
    """One batch record of `records` (all of one topic and queue, none a transaction's
    half): its bytes as parts to join, and each entry's offset within it and size."""
    first = records[0]
    topic_field = first.tail[: first.properties_at]
    at = _BATCH_HEADER_BYTES + len(topic_field)
    pack = _ENTRY_HEADER.pack
    magic = fmt.ENTRY_MAGIC
    parts: list[bytes] = []
    offsets: list[int] = []
    sizes: list[int] = []
    for i, r in enumerate(records):
        m = r.message
        properties = r.tail[r.properties_at :]
        size = _ENTRY_HEADER_BYTES + len(m.body) + len(properties)
        parts += (
            pack(
                size,
                magic,
                at,
                i,
                m.flag,
                m.sys_flag,
                m.born_timestamp_ms,
                m.born_host,
                m.reconsume_times,
                len(m.body),
            ),
            m.body,
            properties,
        )
        offsets.append(at)
        sizes.append(size)
        at += size
    entries = b"".join(parts)
    head = (
        _BATCH_HEAD_AFTER_CRC.pack(
            len(records),
            first.message.queue_id,
            first_queue_offset,
            phys_offset,
            store_timestamp_ms,
            store_host,
        )
        + topic_field
    )
    crc = zlib.crc32(entries, zlib.crc32(head))
    return [_SIZE_MAGIC_CRC.pack(at, fmt.BATCH_MAGIC, crc), head, entries], offsets, sizes


def parse_batch(
    buf: bytes | memoryview,
    pos: int,
    phys_offset: int,
    verify_crc: bool = True,
    wanted: Container[int] | None = None,
) -> tuple[int, RecordProblem | None, list[StoredMessage]]:
    """Validate and decode the batch record at `buf[pos:]`, which should sit at
    `phys_offset`: (size, None, its messages), or (0, problem, []). With `wanted`, only the
    messages whose physical offsets it holds are decoded (all of it is checked)."""
    available = len(buf) - pos
    if available < _BATCH_HEADER_BYTES + 2:
        return 0, RecordProblem.TRUNCATED, []
    size, magic, crc, count, queue_id, first, phys, store_ts, store_host = (
        _BATCH_HEADER.unpack_from(buf, pos)
    )
    if magic != fmt.BATCH_MAGIC:
        return 0, RecordProblem.BAD_MAGIC, []
    if size < _MIN_BATCH_BYTES or count < 1:
        return 0, RecordProblem.BAD_SIZE, []
    if size > available:
        return 0, RecordProblem.TRUNCATED, []
    if phys != phys_offset:
        return 0, RecordProblem.WRONG_POSITION, []
    view = memoryview(buf)[pos : pos + size]
    if verify_crc and zlib.crc32(view[fmt.BATCH_CRC_FROM :]) != crc:
        return 0, RecordProblem.RECORD_CRC, []
    topic_end = _BATCH_HEADER_BYTES + 2 + (view[64] << 8 | view[65])
    try:
        topic = bytes(view[_BATCH_HEADER_BYTES + 2 : topic_end]).decode()
    except UnicodeDecodeError:
        return 0, RecordProblem.BAD_LAYOUT, []
    messages = []
    at = topic_end
    unpack = _ENTRY_HEADER.unpack_from
    for i in range(count):
        if at + _ENTRY_HEADER_BYTES + 2 > size:
            return 0, RecordProblem.BAD_LAYOUT, []
        (esize, emagic, back, index, flag, sys_flag, born_ts, born_host, reconsume, body_len) = (
            unpack(view, at)
        )
        body_end = at + _ENTRY_HEADER_BYTES + body_len
        if (
            emagic != fmt.ENTRY_MAGIC
            or back != at
            or index != i
            or body_len < 0
            or at + esize > size
            or body_end + 2 > at + esize
            or body_end + 2 + (view[body_end] << 8 | view[body_end + 1]) != at + esize
        ):
            return 0, RecordProblem.BAD_LAYOUT, []
        if wanted is not None and phys_offset + at not in wanted:
            at += esize
            continue
        body = bytes(view[at + _ENTRY_HEADER_BYTES : body_end])
        header = (
            esize,
            emagic,
            zlib.crc32(body),
            queue_id,
            flag,
            first + i,
            phys_offset + at,
            sys_flag,
            born_ts,
            born_host,
            store_ts,
            store_host,
            reconsume,
            0,
            body_len,
        )
        messages.append(StoredMessage(header, body, topic, bytes(view[body_end + 2 : at + esize])))
        at += esize
    if at != size:
        return 0, RecordProblem.BAD_LAYOUT, []
    return size, None, messages


def standalone(message: StoredMessage) -> bytes:
    """A message read from a batch entry as a record of its own, with the same offsets,
    times and hosts (what a compacted copy or a transaction check carries)."""
    raw = message.properties_raw
    tail = _topic_field(message.topic) + _PROPERTIES_LENGTH(len(raw)) + raw
    m = Message(
        message.topic,
        message.queue_id,
        message.body,
        {},
        message.flag,
        message.sys_flag,
        message.born_timestamp_ms,
        message.born_host,
        message.reconsume_times,
        message.prepared_tx_offset,
    )
    size = _FRAMING_BYTES + len(message.body) + len(tail)
    prepared = PreparedRecord(m, tail, size, len(tail) - len(raw) - 2)
    return b"".join(
        finish(
            prepared,
            message.queue_offset,
            message.phys_offset,
            message.store_timestamp_ms,
            message.store_host,
        )
    )


def entry_back(buf: bytes | memoryview, pos: int) -> int | None:
    """For the bytes of a batch entry at `buf[pos:]`: how far back its batch record
    starts; None when they are not an entry's."""
    if len(buf) - pos < fmt.ENTRY_BACK_AT + 4:
        return None
    if _SIZE_AND_MAGIC(buf, pos)[1] != fmt.ENTRY_MAGIC:
        return None
    back: int = fmt.ENTRY_BACK.unpack_from(buf, pos + fmt.ENTRY_BACK_AT)[0]
    return back if back >= _BATCH_HEADER_BYTES + 2 else None


def parse_records_at(
    buf: bytes | memoryview, pos: int, phys_offset: int, verify_crc: bool = True
) -> tuple[int, RecordProblem | None, list[StoredMessage] | None]:
    """A record of either kind at `buf[pos:]`: (size, None, its messages) for a message or
    batch record, (size, None, None) for a blank, (0, problem, None) otherwise."""
    if len(buf) - pos >= fmt.BLANK_RECORD_BYTES and _SIZE_AND_MAGIC(buf, pos)[1] == fmt.BATCH_MAGIC:
        size, problem, messages = parse_batch(buf, pos, phys_offset, verify_crc)
        return size, problem, (messages if problem is None else None)
    size, problem, message = parse_at(buf, pos, phys_offset, verify_crc)
    return size, problem, ([message] if message is not None else None)


def blank(size: int) -> bytes:
    """The filler that ends a segment: `size` is the number of bytes left in it."""
    return fmt.BLANK_RECORD.pack(size, fmt.BLANK_MAGIC)


def check_at(
    buf: bytes | memoryview, pos: int, phys_offset: int, verify_crc: bool = True
) -> tuple[int, RecordProblem | None, bool]:
    """Validate the record at `buf[pos:]`, which should sit at `phys_offset`.

    Returns (size, problem, is_blank). `size` is meaningful only when problem is None. A
    batch record is checked whole.
    """
    size, problem, messages = parse_records_at(buf, pos, phys_offset, verify_crc)
    return size, problem, problem is None and messages is None


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
