"""Settings of the message store: one frozen dataclass, every field with unit and default."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from capstan.common.errors import ConfigError

_U32_MAX = 0xFFFF_FFFF
GIB = 1024**3
MIB = 1024**2


class FlushMode(enum.Enum):
    """When an append is acknowledged relative to fsync."""

    SYNC_FLUSH = "SYNC_FLUSH"
    """Acknowledge only after the bytes are fsynced (group commit: one fsync serves every
    writer waiting at that moment). Capstan's default: an acknowledged message survives a
    power cut."""

    ASYNC_FLUSH = "ASYNC_FLUSH"
    """Acknowledge once the bytes are in the page cache; fsync every `flush_interval_ms`.
    A crash of the process loses nothing; a crash of the machine may lose the last interval."""


@dataclass(frozen=True)
class IndexSettings:
    """Sizes of one index file; changing them sets existing files aside (their size won't fit)."""

    hash_slots_per_file: int = 5_000_000
    """Hash slots per file, 4 bytes each; default 5,000,000 (20 MB).

    More slots make shorter chains; RocketMQ's default too.
    """

    index_entries_per_file: int = 20_000_000
    """Entries per file, 20 bytes each, before the next file starts; default 20,000,000 (400 MB).

    Four entries per slot on average at the defaults, as in RocketMQ. A file has its full
    size from the start, but takes disk blocks only for its header, its slots and the entries
    it holds (reserved 4 MB ahead), so a new default file costs 24 MB of disk, not 420.
    """

    def __post_init__(self) -> None:
        for name in ("hash_slots_per_file", "index_entries_per_file"):
            value = getattr(self, name)
            if not 1 <= value <= _U32_MAX:
                raise ConfigError(f"{name} must be between 1 and {_U32_MAX}, got {value}")


@dataclass(frozen=True)
class StoreSettings:
    """How the broker stores messages on disk."""

    commitlog_segment_bytes: int = GIB
    """Size of one CommitLog segment file, in bytes. Default 1 GiB. Must hold the largest
    record (max_message_bytes plus topic, properties and 124 bytes of framing)."""

    consume_queue_units_per_segment: int = 300_000
    """Units (20 bytes each) per consume-queue segment file. Default 300,000 (6 MB files)."""

    flush_mode: FlushMode = FlushMode.SYNC_FLUSH
    """SYNC_FLUSH (default) or ASYNC_FLUSH; see FlushMode."""

    flush_interval_ms: int = 500
    """ASYNC_FLUSH only: how often the CommitLog is fsynced, in milliseconds. Default 500."""

    flush_disk_timeout_ms: int = 5_000
    """SYNC_FLUSH only: how long a writer waits for its fsync before it is answered
    FLUSH_DISK_TIMEOUT (the message is written but not yet known durable). Default 5,000."""

    checkpoint_interval_ms: int = 1_000
    """How often consume queues and the index are fsynced and the checkpoint rewritten, in
    milliseconds. Recovery after a crash re-dispatches at most this much. Default 1,000."""

    max_message_bytes: int = 4 * MIB
    """Largest accepted message body, in bytes. Default 4 MiB."""

    file_reserved_hours: float = 72.0
    """Retention by age: a CommitLog segment last written longer ago than this is deleted,
    in hours. Default 72."""

    disk_max_used_ratio: float = 0.75
    """Retention by disk usage: while the disk holding the store is fuller than this
    fraction, the oldest segments are deleted even if younger than file_reserved_hours
    (the segment being written and the one before it are always kept). Fullness is
    used / (used + available), the Use% of `df`: blocks reserved for root count as
    neither. Default 0.75."""

    clean_interval_ms: int = 10_000
    """How often retention runs, in milliseconds. Default 10,000."""

    index_enabled: bool = True
    """Whether messages are indexed by key and message id. Default true."""

    index: IndexSettings = field(default_factory=IndexSettings)
    """Sizes of the index files; see IndexSettings."""

    store_host: str = "127.0.0.1:8081"
    """host:port written into each record as the storing broker. Default 127.0.0.1:8081."""

    def __post_init__(self) -> None:
        if self.commitlog_segment_bytes < 4096:
            raise ValueError("commitlog_segment_bytes must be at least 4096")
        if self.consume_queue_units_per_segment < 1:
            raise ValueError("consume_queue_units_per_segment must be positive")
        if not 0 < self.disk_max_used_ratio <= 1:
            raise ValueError("disk_max_used_ratio must be in (0, 1]")
        for name in (
            "flush_interval_ms",
            "flush_disk_timeout_ms",
            "checkpoint_interval_ms",
            "clean_interval_ms",
            "max_message_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
