"""The CommitLog: one append-only log of every message of every topic on this broker.

Physical offsets are global byte positions in the logical log, which is cut into segments
(see segments.py). The caller (the message store) holds its append lock around `append`;
`sync` may run concurrently from the flush thread.
"""

from __future__ import annotations

import logging
import pathlib
import threading
from collections.abc import Container, Sequence
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


@dataclass(slots=True)
class RecordCheck:
    """What `CommitLog.check_records` found."""

    damaged: list[int]  # offsets of records that fail their checks
    next_offset: int  # where the next check starts
    skipped: bool  # the last damaged record's framing is gone: the rest of its segment
    # was not checked (nothing says where the next record starts)


def _batch_group(
    batch: list[rec.PreparedRecord], size: int
) -> tuple[list[rec.PreparedRecord], int]:
    """A batch of one is stored as a record of its own."""
    return (batch, size) if len(batch) > 1 else (batch, batch[0].size)


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
        runs: Sequence[int] = (),
    ) -> tuple[list[int], list[int]]:
        """Write `records` after the current end; return each one's physical offset and
        stored size.

        `runs` cuts `records` into consecutive runs (their lengths, adding up to all of
        them; empty: every record alone): a run of one is a record of its own, a longer
        one (the caller's promise: one topic and queue, consecutive queue offsets, no
        transaction's half) is stored as batch records, as many as it takes to fit
        segments. The caller holds the append lock. All bytes bound for one segment go
        out in one write. If a write fails (disk full, I/O error) every segment is cut back
        to where it was, the end does not move, and the OSError propagates.
        """
        chunks, positions, sizes, end = self._layout(
            records, queue_offsets, store_timestamp_ms, runs or [1] * len(records)
        )
        self._write_chunks(chunks)
        with self._state_lock:
            self.write_offset = end
        return positions, sizes

    def _layout(
        self,
        records: list[rec.PreparedRecord],
        queue_offsets: list[int],
        store_timestamp_ms: int,
        runs: Sequence[int],
    ) -> tuple[list[_Chunk], list[int], list[int], int]:
        if sum(runs) != len(records):
            raise ValueError(f"runs of {sum(runs)} records for {len(records)}")
        offset = self.write_offset
        segment_start = offset - offset % self.segment_bytes
        segment_end = segment_start + self.segment_bytes
        chunk = _Chunk(segment_start, offset - segment_start, [])
        chunks = [chunk]
        positions: list[int] = []
        sizes: list[int] = []
        host = self.store_host
        limit = self.max_record_bytes()
        at = 0
        for group in self._record_groups(records, runs, limit):
            size = group[1]
            if offset + size + fmt.BLANK_RECORD_BYTES > segment_end:
                if size > limit:
                    raise rec.RecordTooLarge(
                        f"record of {size} bytes does not fit a segment of "
                        f"{self.segment_bytes} bytes"
                    )
                chunk.parts.append(rec.blank(segment_end - offset))
                offset, segment_end = segment_end, segment_end + self.segment_bytes
                chunk = _Chunk(offset, 0, [])
                chunks.append(chunk)
            members = group[0]
            if len(members) == 1:
                record = members[0]
                chunk.parts.extend(
                    rec.finish(record, queue_offsets[at], offset, store_timestamp_ms, host)
                )
                positions.append(offset)
                sizes.append(record.size)
            else:
                parts, within, entry_sizes = rec.finish_batch(
                    members, queue_offsets[at], offset, store_timestamp_ms, host
                )
                chunk.parts.extend(parts)
                positions.extend(offset + w for w in within)
                sizes.extend(entry_sizes)
            at += len(members)
            offset += size
        return chunks, positions, sizes, offset

    @staticmethod
    def _record_groups(
        records: list[rec.PreparedRecord], runs: Sequence[int], limit: int
    ) -> list[tuple[list[rec.PreparedRecord], int]]:
        """(records, stored size) of each record to write: a run of one as itself, a longer
        one as batch records of at most `limit` bytes (a message too large for any batch
        stands alone, and fails as it would alone)."""
        groups: list[tuple[list[rec.PreparedRecord], int]] = []
        at = 0
        for run in runs:
            members = records[at : at + run]
            at += run
            if run == 1:
                groups.append((members, members[0].size))
                continue
            batch: list[rec.PreparedRecord] = []
            size = 0
            for r in members:
                base = rec.batch_size([r]) if not batch else size + r.entry_size
                if batch and base > limit:
                    groups.append(_batch_group(batch, size))
                    batch, base = [], rec.batch_size([r])
                batch.append(r)
                size = base
            groups.append(_batch_group(batch, size))
        return groups

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

    # -- replication -------------------------------------------------------------------

    def read_whole_records(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """The written bytes from `offset` (a record boundary) for a replica, and the offset
        that follows them: whole records only, within one segment, about `max_bytes` (more
        when the first record is larger); no bytes when nothing is written there yet. A
        segment's closing blank record is sent as its 8-byte header, as it is stored, and
        the next offset is then the next segment's start."""
        end = self.write_offset
        segment = self.files.find(offset)
        if segment is None or offset >= end:
            return b"", offset
        position = offset - segment.start
        segment_end = segment.start + self.segment_bytes
        limit = min(end, segment_end) - offset
        data = segment.read(position, min(limit, max(max_bytes, fmt.SIZE_AND_MAGIC.size)))
        cut, closes = _whole_records(data, offset)
        if cut == 0:  # the first record alone is larger than max_bytes
            size = fmt.SIZE_AND_MAGIC.unpack_from(data)[0]
            if not 0 < size <= limit:
                raise rec.CorruptRecord(offset, rec.RecordProblem.BAD_MAGIC)
            return segment.read(position, size), offset + size
        return data[:cut], (segment_end if closes else offset + cut)

    def append_copy(self, offset: int, data: bytes) -> None:
        """Write bytes a master sent (`read_whole_records` there) at the same offset here.

        `offset` must be this log's end, or, for an empty log, the start of a segment (the
        master's first one). The caller holds the append lock. A failed write is cut back
        and the OSError propagates, as in `append`."""
        empty = self.files.last is None
        if offset != self.write_offset and not (empty and offset % self.segment_bytes == 0):
            raise ValueError(
                f"a copy at {offset} does not continue this log (end {self.write_offset})"
            )
        cut, closes_segment = _whole_records(data, offset)
        if cut != len(data):
            raise ValueError(f"a copy at {offset} ends inside a record")
        start = offset - offset % self.segment_bytes
        end = start + self.segment_bytes if closes_segment else offset + len(data)
        if end > start + self.segment_bytes:
            raise ValueError(f"a copy of {len(data)} bytes at {offset} crosses a segment end")
        self._write_chunks([_Chunk(start, offset - start, [data])])
        with self._state_lock:
            if empty:
                self.flushed_offset = offset
            self.write_offset = end

    def truncate(self, offset: int) -> None:
        """Cut the log back to `offset` (a record boundary at or below its end): a returning
        replica drops the tail that diverged from the new master. The caller holds the
        append lock."""
        if offset > self.write_offset:
            raise ValueError(f"cannot cut a log ending at {self.write_offset} to {offset}")
        self.files.remove_from(offset)  # the segments wholly past it
        segment = self.files.find(offset)
        if segment is not None:
            segment.truncate(offset - segment.start)
            segment.sync()
        with self._state_lock:
            self.write_offset = offset
            self.flushed_offset = min(self.flushed_offset, offset)

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
        """Decode the record (or batch entry) at `phys_offset`; None if there is none;
        CorruptRecord if bad."""
        head = self.read(phys_offset, fmt.SIZE_AND_MAGIC.size + 4)
        if head is None:
            return None
        size, magic = fmt.SIZE_AND_MAGIC.unpack_from(head)
        back = rec.entry_back(head, 0)
        if back is not None:
            batch = self.read_batch(phys_offset - back, phys_offset, verify_crc, (phys_offset,))
            for entry in batch:
                if entry.phys_offset == phys_offset:
                    return entry
            raise rec.CorruptRecord(phys_offset, rec.RecordProblem.BAD_LAYOUT)
        if magic != fmt.MESSAGE_MAGIC or size <= fmt.RECORD_HEADER_BYTES:
            raise rec.CorruptRecord(phys_offset, rec.RecordProblem.BAD_MAGIC)
        data = self.read(phys_offset, size)
        if data is None:
            return None
        _, problem, message = rec.parse_at(data, 0, phys_offset, verify_crc)
        if message is None:
            raise rec.CorruptRecord(phys_offset, problem or rec.RecordProblem.BAD_MAGIC)
        return message

    def read_batch(
        self,
        batch_offset: int,
        holding: int,
        verify_crc: bool = True,
        wanted: Container[int] | None = None,
    ) -> list[StoredMessage]:
        """The messages of the batch record at `batch_offset` (those at the offsets in
        `wanted`, if given), checked whole; it must hold the entry at `holding`
        (CorruptRecord, naming `holding`, if not or if it is bad)."""
        head = self.read(batch_offset, fmt.SIZE_AND_MAGIC.size)
        if head is None:
            raise rec.CorruptRecord(holding, rec.RecordProblem.BAD_LAYOUT)
        size, magic = fmt.SIZE_AND_MAGIC.unpack(head)
        if magic != fmt.BATCH_MAGIC or not batch_offset < holding < batch_offset + size:
            raise rec.CorruptRecord(holding, rec.RecordProblem.BAD_LAYOUT)
        data = self.read(batch_offset, size) if size <= self.max_record_bytes() else None
        if data is None:
            raise rec.CorruptRecord(holding, rec.RecordProblem.BAD_SIZE)
        _, problem, messages = rec.parse_batch(data, 0, batch_offset, verify_crc, wanted)
        if problem is not None:
            raise rec.CorruptRecord(holding, problem)
        return messages

    def record_holding(self, phys_offset: int) -> int | None:
        """Where the record holding the byte at `phys_offset` starts (a batch record's
        start for one of its entries): read off the record or entry there when its framing
        holds, else found by walking the segment's records from its first; None when the
        walk cannot get there (a damaged size on the way)."""
        segment = self.files.find(phys_offset)
        if segment is None:
            return None
        head = self.read(phys_offset, fmt.SIZE_AND_MAGIC.size + 4)
        if head is not None:
            back = rec.entry_back(head, 0)
            start = phys_offset if back is None else phys_offset - back
            found = self.read(start, fmt.SIZE_AND_MAGIC.size) if start >= segment.start else None
            if found is not None:
                size, magic = fmt.SIZE_AND_MAGIC.unpack(found)
                if rec.framed(size, magic) and start <= phys_offset < start + size:
                    return start
        at = max(segment.start, self.min_offset)
        end = min(self.write_offset, segment.start + self.segment_bytes)
        while at < end:
            head = self.read(at, fmt.SIZE_AND_MAGIC.size)
            if head is None:
                return None
            size, magic = fmt.SIZE_AND_MAGIC.unpack(head)
            if not rec.framed(size, magic):
                return None
            if at <= phys_offset < at + size:
                return at
            at += size
        return None

    def check_records(self, offset: int, max_bytes: int) -> RecordCheck:
        """Check every record from `offset` (a record boundary) for about `max_bytes`,
        within one segment, CRCs included (a scrub of bytes at rest). A damaged record whose
        size field still fits is stepped over; one whose framing is gone ends the check of
        its segment (`skipped`: the next record cannot be found until it is mended) and
        the next check starts with the next segment."""
        offset = max(offset, self.min_offset)
        end = self.write_offset
        segment = self.files.find(offset)
        if offset >= end:
            return RecordCheck([], offset, False)
        if segment is None:  # a segment removed meanwhile: the next one
            return RecordCheck([], self.files.segment_start(offset) + self.segment_bytes, False)
        limit = min(end, segment.start + self.segment_bytes) - offset
        want = min(limit, max(max_bytes, fmt.BLANK_RECORD_BYTES))
        data = segment.read(offset - segment.start, want)
        damaged: list[int] = []
        at = 0
        while at + fmt.BLANK_RECORD_BYTES <= len(data):
            size, problem, is_blank = rec.check_at(data, at, offset + at)
            if problem is None:
                if is_blank:
                    return RecordCheck(damaged, segment.start + self.segment_bytes, False)
                at += size
                continue
            declared, magic = fmt.SIZE_AND_MAGIC.unpack_from(data, at)
            if problem is rec.RecordProblem.TRUNCATED and declared <= limit - at:
                if at > 0:
                    break  # runs past what was read: the next check starts with it
                return self.check_records(offset, declared)  # one record over max_bytes
            damaged.append(offset + at)
            if not rec.framed(declared, magic) or declared > limit - at:
                return RecordCheck(damaged, segment.start + self.segment_bytes, True)
            at += declared
        return RecordCheck(damaged, offset + at, False)

    def rewrite_record(self, phys_offset: int, record: bytes) -> bool:
        """Write a sound copy of the record at `phys_offset` (from another replica, whose
        log holds the same bytes at the same offsets) over this log's damaged one, and
        fsync it. False when the stored bytes already equal it; ValueError when `record` is
        not a sound record of that offset or does not lie wholly in this log's written
        bytes. The caller holds the append lock (no truncation meanwhile)."""
        size, problem, is_blank = rec.check_at(record, 0, phys_offset)
        if problem is not None or is_blank or size != len(record):
            reason = problem.value if problem else "not one message record"
            raise ValueError(f"the copy of the record at {phys_offset} is unsound: {reason}")
        segment = self.files.find(phys_offset)
        if (
            segment is None
            or phys_offset < self.min_offset
            or phys_offset + size > min(self.write_offset, segment.start + self.segment_bytes)
        ):
            raise ValueError(f"no written record of {size} bytes at {phys_offset} in this log")
        if segment.read(phys_offset - segment.start, size) == record:
            return False
        segment.write(phys_offset - segment.start, record)
        segment.sync()
        return True

    def read_store_timestamp(self, phys_offset: int) -> int | None:
        """The store time of the record (or batch entry) at `phys_offset`, unchecked."""
        head = self.read(phys_offset, fmt.SIZE_AND_MAGIC.size + 4)
        back = rec.entry_back(head, 0) if head is not None else None
        if back is not None:
            raw = self.read(phys_offset - back + fmt.BATCH_STORE_TIMESTAMP_AT, 8)
        else:
            raw = self.read(phys_offset + fmt.STORE_TIMESTAMP_AT, 8)
        return int.from_bytes(raw, "big") if raw is not None else None

    def close(self) -> None:
        self.files.close()


def _whole_records(data: bytes, offset: int) -> tuple[int, bool]:
    """How many leading bytes of `data` (read at `offset`) are whole records, and whether
    they end with a segment's blank record (nothing follows it in that segment)."""
    cut = 0
    while cut + fmt.SIZE_AND_MAGIC.size <= len(data):
        size, magic = fmt.SIZE_AND_MAGIC.unpack_from(data, cut)
        if magic == fmt.BLANK_MAGIC:
            return cut + fmt.BLANK_RECORD_BYTES, True
        if not rec.framed(size, magic):
            raise rec.CorruptRecord(offset + cut, rec.RecordProblem.BAD_MAGIC)
        if cut + size > len(data):
            break
        cut += size
    return cut, False
