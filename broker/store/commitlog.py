"""The CommitLog: one append-only log of every message of every topic on this broker.

Physical offsets are global byte positions in the logical log, which is cut into segments
(see segments.py). The caller (the message store) holds its append lock around `append`;
`sync` may run concurrently from the flush thread.
"""

from __future__ import annotations

import logging
import pathlib
import threading
from dataclasses import dataclass

from capstan.broker.store import format as fmt
from capstan.broker.store import record as rec
from capstan.broker.store.message import StoredMessage
from capstan.broker.store.segments import Segment, SegmentDirectory

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Chunk:
    """Bytes bound for one segment in one write."""

    segment_start: int
    position: int  # within the segment
    parts: list[bytes]


class CommitLog:
    """Append, read and sync the CommitLog's segment files."""

    def __init__(self, directory: pathlib.Path, segment_bytes: int, store_host: bytes) -> None:
        self.files = SegmentDirectory(directory, segment_bytes)
        self.segment_bytes = segment_bytes
        self.store_host = store_host
        last = self.files.last
        # Recovery moves this to the end of the last valid record.
        self.write_offset = last.start + last.length() if last else 0
        self.flushed_offset = self.write_offset
        self._state_lock = threading.Lock()
        self._dirty: set[Segment] = set()

    # -- positions ---------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        first = self.files.first
        return first.start if first else self.write_offset

    def max_record_bytes(self) -> int:
        """The largest record a segment can hold (it must leave room for a blank)."""
        return self.segment_bytes - fmt.BLANK_RECORD_BYTES

    # -- writing -----------------------------------------------------------------------

    def append(
        self,
        records: list[rec.PreparedRecord],
        queue_offsets: list[int],
        store_timestamp_ms: int,
    ) -> list[int]:
        """Write `records` after the current end; return each one's physical offset.

        The caller holds the append lock. All bytes bound for one segment go out in one
        write. If a write fails (disk full, I/O error) every segment is cut back to where
        it was, the end does not move, and the OSError propagates.
        """
        chunks, positions, end = self._layout(records, queue_offsets, store_timestamp_ms)
        self._write_chunks(chunks)
        with self._state_lock:
            self.write_offset = end
        return positions

    def _layout(
        self,
        records: list[rec.PreparedRecord],
        queue_offsets: list[int],
        store_timestamp_ms: int,
    ) -> tuple[list[_Chunk], list[int], int]:
        offset = self.write_offset
        segment_start = offset - offset % self.segment_bytes
        segment_end = segment_start + self.segment_bytes
        chunk = _Chunk(segment_start, offset - segment_start, [])
        chunks = [chunk]
        positions: list[int] = []
        host = self.store_host
        for record, queue_offset in zip(records, queue_offsets, strict=True):
            if offset + record.size + fmt.BLANK_RECORD_BYTES > segment_end:
                if record.size > self.max_record_bytes():
                    raise rec.RecordTooLarge(
                        f"record of {record.size} bytes does not fit a segment of "
                        f"{self.segment_bytes} bytes"
                    )
                chunk.parts.append(rec.blank(segment_end - offset))
                offset, segment_end = segment_end, segment_end + self.segment_bytes
                chunk = _Chunk(offset, 0, [])
                chunks.append(chunk)
            chunk.parts.extend(rec.finish(record, queue_offset, offset, store_timestamp_ms, host))
            positions.append(offset)
            offset += record.size
        return chunks, positions, offset

    def _write_chunks(self, chunks: list[_Chunk]) -> None:
        undo: list[tuple[Segment, int, bool]] = []
        try:
            for chunk in chunks:
                if not chunk.parts:
                    continue
                segment = self.files.find(chunk.segment_start)
                created = segment is None
                if segment is None:
                    segment = self.files.create(chunk.segment_start)
                undo.append((segment, chunk.position, created))
                segment.write(chunk.position, b"".join(chunk.parts))
                with self._state_lock:
                    self._dirty.add(segment)
        except OSError:
            self._undo(undo)
            raise

    def _undo(self, undo: list[tuple[Segment, int, bool]]) -> None:
        for segment, position, created in reversed(undo):
            try:
                if created:
                    self.files.remove(segment)
                else:
                    segment.truncate(position)
            except OSError:
                log.exception(
                    "could not cut %s back to %d after a failed write", segment.path, position
                )

    # -- durability --------------------------------------------------------------------

    def sync(self) -> int:
        """fdatasync every segment written since the last sync; return the durable end."""
        with self._state_lock:
            target = self.write_offset
            dirty = list(self._dirty)
            self._dirty.clear()
        try:
            for segment in sorted(dirty, key=lambda s: s.start):
                segment.sync()
        except OSError:
            with self._state_lock:
                self._dirty.update(dirty)
            raise
        with self._state_lock:
            self.flushed_offset = max(self.flushed_offset, target)
            return self.flushed_offset

    # -- reading -----------------------------------------------------------------------

    def read(self, phys_offset: int, size: int) -> bytes | None:
        """`size` bytes at `phys_offset`, or None if they are not all there."""
        segment = self.files.find(phys_offset)
        if segment is None:
            return None
        data = segment.read(phys_offset - segment.start, size)
        return data if len(data) == size else None

    def read_message(self, phys_offset: int, verify_crc: bool = True) -> StoredMessage | None:
        """Decode the record at `phys_offset`; None if there is none; CorruptRecord if bad."""
        head = self.read(phys_offset, fmt.SIZE_AND_MAGIC.size)
        if head is None:
            return None
        size, magic = fmt.SIZE_AND_MAGIC.unpack(head)
        if magic != fmt.MESSAGE_MAGIC or size <= fmt.RECORD_HEADER_BYTES:
            raise rec.CorruptRecord(phys_offset, rec.RecordProblem.BAD_MAGIC)
        data = self.read(phys_offset, size)
        if data is None:
            return None
        _, problem, message = rec.parse_at(data, 0, phys_offset, verify_crc)
        if message is None:
            raise rec.CorruptRecord(phys_offset, problem or rec.RecordProblem.BAD_MAGIC)
        return message

    def read_store_timestamp(self, phys_offset: int) -> int | None:
        raw = self.read(phys_offset + fmt.STORE_TIMESTAMP_AT, 8)
        return int.from_bytes(raw, "big") if raw is not None else None

    def close(self) -> None:
        self.files.close()
