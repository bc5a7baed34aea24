"""On-disk layouts of the CommitLog, the ConsumeQueue and the checkpoint.

Every integer is big-endian, as in RocketMQ's files. Each layout is drawn above the
`struct.Struct` that reads and writes it; change the two together.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

# --------------------------------------------------------------------------------------
# CommitLog record
#
#  0               4               8               12              16
#  +---------------+---------------+---------------+---------------+
#  | total_size    | magic         | body_crc      | queue_id      |
#  +---------------+---------------+---------------+---------------+
#  | flag          | queue_offset (8)              | phys_offset   >
#  +---------------+---------------+---------------+---------------+
#  > (8)           | sys_flag      | born_timestamp_ms (8)         |
#  +---------------+---------------+---------------+---------------+
#  | born_host (20: 16-byte IPv6 or IPv4-mapped address, 4-byte port)
#  +---------------------------------------------------------------+
#  | store_timestamp_ms (8)        | store_host (20) ...           >
#  +---------------------------------------------------------------+
#  | reconsume_times | prepared_tx_offset (8) | body_length        |   header: 112 bytes
#  +---------------------------------------------------------------+
#  | body (body_length bytes)                                      |
#  | topic_length (2) | topic (UTF-8)                              |
#  | properties_length (2) | properties (name\x01value\x02 ...)    |
#  | record_crc (4)                                                |
#  +---------------------------------------------------------------+
#
# total_size counts the whole record, itself and record_crc included.
# body_crc is CRC-32 of the body alone (what readers and replicas check per message).
# record_crc is CRC-32 of header + topic/properties section, seeded with body_crc, so it
# covers every byte of the record while hashing the body only once. Recovery accepts a
# record only if magic, sizes, phys_offset (its own position) and both CRCs agree.
#
# A record that does not fit the rest of a segment is not split: an 8-byte blank record
# (total_size = bytes left in the segment, magic = BLANK_MAGIC) ends the segment and the
# record goes to the start of the next one. A record fits only if it leaves room for that
# blank, so a segment always ends in a record boundary.
# --------------------------------------------------------------------------------------

MESSAGE_MAGIC: Final = 0xCA57A501
BLANK_MAGIC: Final = 0xCA57B1A4

RECORD_HEADER = struct.Struct(">iIIiiqqiq20sq20siqi")
RECORD_HEADER_BYTES: Final = RECORD_HEADER.size  # 112
BLANK_RECORD = struct.Struct(">iI")
BLANK_RECORD_BYTES: Final = BLANK_RECORD.size  # 8
SIZE_AND_MAGIC = struct.Struct(">iI")
TOPIC_LENGTH = struct.Struct(">H")
PROPERTIES_LENGTH = struct.Struct(">H")
RECORD_CRC = struct.Struct(">I")
RECORD_TRAILER_BYTES: Final = RECORD_CRC.size
PHYS_OFFSET_FIELD_AT: Final = 28

MAX_TOPIC_BYTES: Final = 0xFFFF
MAX_PROPERTIES_BYTES: Final = 0x7FFF

assert RECORD_HEADER_BYTES == 112

# Byte position of the store timestamp, for readers that need that field only.
STORE_TIMESTAMP_AT: Final = 68

# --------------------------------------------------------------------------------------
# CommitLog batch record: the messages of one send for one queue, stored as one record
# with one CRC (Kafka's RecordBatch, RocketMQ's inner batch). Single messages, and any
# that are not plain messages (delayed, transactional, ordered by key), keep the record
# above.
#
#  0               4               8               12              16
#  +---------------+---------------+---------------+---------------+
#  | total_size    | BATCH_MAGIC   | batch_crc     | count         |
#  +---------------+---------------+---------------+---------------+
#  | queue_id      | first_queue_offset (8)        | phys_offset   >
#  +---------------+---------------+---------------+---------------+
#  > (8)           | store_timestamp_ms (8)        | store_host    >
#  +---------------+---------------+---------------+---------------+
#  > (20) ...                                      |  header: 64 bytes
#  +-----------------------------------------------+
#  | topic_length (2) | topic (UTF-8)                              |
#  | entry 0 | entry 1 | ... | entry count-1                       |
#  +---------------------------------------------------------------+
#
# Each entry is one message, addressable on its own: its consume-queue unit holds the
# entry's own physical offset and size, and its offset message id is store host + that
# offset, as for a single record.
#
#  +---------------+---------------+---------------+---------------+
#  | entry_size    | ENTRY_MAGIC   | back          | index         |
#  +---------------+---------------+---------------+---------------+
#  | flag          | sys_flag      | born_timestamp_ms (8)         |
#  +---------------+---------------+---------------+---------------+
#  | born_host (20)                                                |
#  +---------------+---------------+-------------------------------+
#  | reconsume_times | body_length |   entry header: 60 bytes
#  +---------------------------------------------------------------+
#  | body | properties_length (2) | properties                    |
#  +---------------------------------------------------------------+
#
# back: bytes from the batch record's start to this entry (a reader of one entry finds the
# shared fields there); index: the entry's place in the batch (its queue offset is
# first_queue_offset + index). batch_crc is CRC-32 of every byte of the record after it,
# the entries' bodies included: one CRC for the batch, checked whenever any of it is read.
# A batch lies within one segment, like any record, so a segment still ends in a record
# boundary and a replica's copy holds a batch whole or not at all.
# --------------------------------------------------------------------------------------

BATCH_MAGIC: Final = 0xCA57BA7C
ENTRY_MAGIC: Final = 0xCA57E471

BATCH_HEADER = struct.Struct(">iIIiiqqq20s")
BATCH_HEADER_BYTES: Final = BATCH_HEADER.size  # 64, then the topic's length and the topic
BATCH_CRC_FROM: Final = 12
BATCH_HEAD_AFTER_CRC = struct.Struct(">iiqqq20s")
ENTRY_HEADER = struct.Struct(">iIiiiiq20sii")
ENTRY_HEADER_BYTES: Final = ENTRY_HEADER.size  # 60
ENTRY_BACK = struct.Struct(">i")
ENTRY_BACK_AT: Final = 8
BATCH_STORE_TIMESTAMP_AT: Final = 36

assert BATCH_HEADER_BYTES == 64 and ENTRY_HEADER_BYTES == 60

# --------------------------------------------------------------------------------------
# ConsumeQueue unit: one per message of a (topic, queue), 20 bytes, so logical offset N
# sits at byte N * 20 of the queue's logical file.
#
#  +-------------------------------+---------------+-------------------------------+
#  | commitlog_offset (8)          | size (4)      | tag_hash (8)                  |
#  +-------------------------------+---------------+-------------------------------+
#
# A unit of all zeros is a hole: the position exists but holds no message (a queue rebuilt
# from the middle of a segment, or a message whose record was destroyed on disk).
# --------------------------------------------------------------------------------------

CQ_UNIT = struct.Struct(">qiq")
CQ_UNIT_BYTES: Final = CQ_UNIT.size  # 20

# --------------------------------------------------------------------------------------
# Checkpoint file (`checkpoint`), rewritten atomically.
#
#  +---------------+---------------+-------------------------------+
#  | magic         | version       | commitlog_flushed_offset (8)  |
#  +---------------+---------------+-------------------------------+
#  | queues_durable_offset (8)     | index_durable_offset (8)      |
#  +-------------------------------+---------------+---------------+
#  | written_at_ms (8)             | crc           |
#  +-------------------------------+---------------+
#
# commitlog_flushed_offset: every CommitLog byte below it was fsynced.
# queues_durable_offset / index_durable_offset: every record below it has its consume-queue
# unit / index entries fsynced. Recovery re-validates and re-dispatches from the lowest.
# --------------------------------------------------------------------------------------

CHECKPOINT_MAGIC: Final = 0xCA57C4E0
CHECKPOINT_VERSION: Final = 1
CHECKPOINT = struct.Struct(">IIqqqqI")


def crc32(data: bytes | bytearray | memoryview, seed: int = 0) -> int:
    """CRC-32 (zlib's polynomial) of `data`, continuing from `seed`."""
    return zlib.crc32(data, seed)


def segment_name(start_offset: int) -> str:
    """Segment files are named by their first byte's offset, zero-padded to 20 digits."""
    return f"{start_offset:020d}"
