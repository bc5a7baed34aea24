"""Crash recovery: validate the CommitLog's tail and bring queues and index back in line.

Recovery starts at the checkpoint (or at the very beginning if there is none), checks
every record from there (magic, sizes, its own position, both CRCs) and re-dispatches
each to its consume queue and the index, skipping units that are already there.

At the first invalid record it decides between two cases:
- torn tail: nothing valid follows. The log is cut there (and the cut made durable), and
  everything from that point is reported as dropped.
- damaged middle: a valid record follows (bytes flipped on disk). The damaged range is
  skipped and reported, never truncated, so no acknowledged message after it is lost;
  queue offsets whose record was destroyed become holes that readers step over.

Afterwards consume-queue units pointing past the end of the log are cut, queues that lost
units (shorter than the queue table of the last checkpoint, or with a gap) are rebuilt
from the whole log, and the index forgets entries past the end.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from capstan.broker.store import format as fmt
from capstan.broker.store import record as rec
from capstan.broker.store.checkpoint import Checkpoint
from capstan.broker.store.commitlog import CommitLog
from capstan.broker.store.consume_queue import ConsumeQueue, ConsumeQueueStore, hole_units
from capstan.broker.store.dispatch import add_index_entries
from capstan.broker.store.index import IndexService
from capstan.broker.store.message import (
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    StoredMessage,
    queue_tag_code,
)
from capstan.broker.store.segments import Segment

log = logging.getLogger(__name__)

_CHUNK_BYTES = 8 * 1024 * 1024
_MAGIC_BYTES = (fmt.MESSAGE_MAGIC.to_bytes(4, "big"), fmt.BATCH_MAGIC.to_bytes(4, "big"))


def _next_magic(buf: bytes, start: int) -> int:
    """Where the next magic of a message or batch record lies in `buf` from `start`; -1."""
    found = [at for at in (buf.find(magic, start) for magic in _MAGIC_BYTES) if at >= 0]
    return min(found, default=-1)


_UNIT = fmt.CQ_UNIT.pack
_PENDING_MAX = 4096
"""Units gathered before the dispatcher writes them (and the index entries)."""


@dataclass
class RecoveryReport:
    """What recovery found and did; `summary()` is what gets logged."""

    crashed: bool
    checkpoint: Checkpoint | None
    scanned_from: int = 0
    end_offset: int = 0
    records_checked: int = 0
    units_dispatched: int = 0
    truncated_at: int | None = None
    truncated_bytes: int = 0
    removed_segments: list[str] = field(default_factory=list)
    damaged_ranges: list[tuple[int, int]] = field(default_factory=list)
    queues_rebuilt: list[str] = field(default_factory=list)
    stale_units_dropped: int = 0
    hole_units: int = 0

    @property
    def lost_nothing(self) -> bool:
        return self.truncated_bytes == 0 and not self.damaged_ranges and not self.removed_segments

    def summary(self) -> str:
        kind = "after a crash" if self.crashed else "after a clean stop"
        where = "no checkpoint: whole log" if self.checkpoint is None else "from checkpoint"
        lines = [
            f"recovery {kind} ({where}, offset {self.scanned_from}): checked "
            f"{self.records_checked} records, log ends at {self.end_offset}, re-dispatched "
            f"{self.units_dispatched} queue units"
        ]
        if self.truncated_at is not None:
            lines.append(
                f"torn tail: dropped {self.truncated_bytes} bytes from offset {self.truncated_at}"
                + (
                    f" and segments {', '.join(self.removed_segments)}"
                    if self.removed_segments
                    else ""
                )
            )
        lines += [f"damaged range skipped: offset {s}, {n} bytes" for s, n in self.damaged_ranges]
        if self.queues_rebuilt:
            lines.append(f"consume queues rebuilt from the log: {', '.join(self.queues_rebuilt)}")
        if self.stale_units_dropped:
            lines.append(
                f"dropped {self.stale_units_dropped} queue units pointing past the log's end"
            )
        if self.hole_units:
            lines.append(f"{self.hole_units} queue offsets lost with damaged records (holes)")
        return "; ".join(lines)


class _Dispatcher:
    """Re-dispatch recovered records into queues and index, skipping what is there."""

    def __init__(
        self,
        queues: ConsumeQueueStore,
        index: IndexService | None,
        index_from: int,
        report: RecoveryReport,
        only: set[tuple[str, int]] | None = None,
    ) -> None:
        self.queues = queues
        self.index = index
        self.index_from = index_from
        self.report = report
        self.only = only
        self.needs_rebuild: set[tuple[str, int]] = set()
        self.touched: set[tuple[str, int]] = set()  # queues given a unit
        self._index_batch: list[tuple[str, int, int]] = []
        # Units gathered per queue, written in one go each (flush): (first offset, units)
        self._runs: dict[tuple[str, int], tuple[int, list[bytes]]] = {}
        self._pending_units = 0

    def visit(self, msg: StoredMessage) -> None:
        if msg.sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_PREPARED:
            return
        key = (msg.topic, msg.queue_id)
        if self.only is None:
            self._index(msg)
            if key in self.needs_rebuild:
                return
        elif key not in self.only:
            return
        unit = _UNIT(msg.phys_offset, msg.size, queue_tag_code(msg.properties))
        run = self._runs.get(key)
        if run is not None:
            if msg.queue_offset == run[0] + len(run[1]):  # the usual case: the next unit
                run[1].append(unit)
                self._pending_units += 1
                self.report.units_dispatched += 1
                if self._pending_units >= _PENDING_MAX:
                    self.flush()
                return
            self._write_run(key)
        queue = self.queues.get_or_create(*key)
        self.touched.add(key)
        if self._place(queue, msg.queue_offset, msg.phys_offset):
            self._runs[key] = (msg.queue_offset, [unit])
            self._pending_units += 1
            self.report.units_dispatched += 1

    def _place(self, queue: ConsumeQueue, queue_offset: int, phys: int) -> bool:
        """Make room for the unit of `queue_offset` (what is there already, a truncation,
        holes); whether it is to be written."""
        end = queue.max_offset
        if queue_offset < end:
            if self.only is not None:
                return False
            present = queue.unit_at(queue_offset)
            if present is not None and present.phys_offset == phys:
                return False
            self.report.stale_units_dropped += queue.truncate(queue_offset)
        elif queue_offset > end and end > queue.min_offset:  # a gap in a non-empty queue
            if self.only is None:
                self.needs_rebuild.add((queue.topic, queue.queue_id))
                return False
            self.report.hole_units += queue_offset - end
            queue.append(end, hole_units(queue_offset - end))
        # An empty queue starts at the record's own offset (retention may have removed the
        # records before it).
        return True

    def _write_run(self, key: tuple[str, int]) -> None:
        first, units = self._runs.pop(key)
        self.queues.get_or_create(*key).append(first, b"".join(units))
        self._pending_units -= len(units)

    def _index(self, msg: StoredMessage) -> None:
        if self.index is None or msg.phys_offset < self.index_from:
            return
        batch = self._index_batch
        add_index_entries(batch, msg.topic, msg.properties, msg.phys_offset, msg.store_timestamp_ms)
        if len(batch) >= 4096:
            self.flush()

    def flush(self) -> None:
        """Write the units and index entries gathered so far."""
        for key in list(self._runs):
            self._write_run(key)
        if self.index is not None and self._index_batch:
            self.index.put_many(self._index_batch)
        self._index_batch.clear()


class _Scanner:
    """Walk valid records of the CommitLog, resolving torn tails and damaged ranges."""

    def __init__(self, commitlog: CommitLog, report: RecoveryReport, repair: bool) -> None:
        self.log = commitlog
        self.report = report
        self.repair = repair  # only the first pass cuts the log; later passes just read

    def run(self, start: int, visit: _Dispatcher) -> int:
        """Visit every valid record from `start`; return the end of the valid log."""
        segments = [s for s in self.log.files.segments if s.start + self.log.segment_bytes > start]
        i, position = (
            0,
            (start - segments[0].start if segments and start > segments[0].start else 0),
        )
        while i < len(segments):
            segment = segments[i]
            stop, blank_end = self._scan_segment(segment, position, visit)
            nxt = segments[i + 1] if i + 1 < len(segments) else None
            if (
                blank_end
                and nxt is not None
                and nxt.start == segment.start + self.log.segment_bytes
            ):
                i, position = i + 1, 0
                continue
            if blank_end and nxt is None:
                return segment.start + self.log.segment_bytes
            if stop == segment.length() and nxt is None:
                return segment.start + stop
            resume = self._resync(segment, stop, nxt)
            if resume is None:
                return self._cut(segment, stop)
            self.report.damaged_ranges.append((segment.start + stop, resume - segment.start - stop))
            log.error(
                "damaged CommitLog range at %d (%d bytes) skipped",
                segment.start + stop,
                resume - segment.start - stop,
            )
            if resume < segment.start + self.log.segment_bytes:
                position = resume - segment.start
            else:
                i, position = segments.index(nxt) if nxt else len(segments), 0
        return start

    def _scan_segment(
        self, segment: Segment, position: int, visit: _Dispatcher
    ) -> tuple[int, bool]:
        """Check records from `position`; return (where checking stopped, ended in a blank)."""
        length = segment.length()
        base = segment.start
        buf_at, buf = position, segment.read(position, min(_CHUNK_BYTES, length - position))
        i = 0
        while True:
            size, problem, messages = rec.parse_records_at(buf, i, base + buf_at + i)
            more = buf_at + len(buf) < length
            if problem in (rec.RecordProblem.TRUNCATED, rec.RecordProblem.END_OF_DATA) and more:
                need = max(
                    _CHUNK_BYTES,
                    size or 0,
                    fmt.SIZE_AND_MAGIC.unpack_from(buf, i)[0] if len(buf) - i >= 8 else 0,
                )
                buf_at += i
                buf, i = segment.read(buf_at, min(need, length - buf_at)), 0
                continue
            if problem is not None:
                return buf_at + i, False
            if messages is None:  # a blank: it must end exactly at the segment's end
                ok = buf_at + i + size == self.log.segment_bytes
                return (buf_at + i + size, True) if ok else (buf_at + i, False)
            for message in messages:
                self.report.records_checked += 1
                visit.visit(message)
            i += size

    def _resync(self, segment: Segment, stop: int, nxt: Segment | None) -> int | None:
        """The physical offset of the next valid record after a bad one, if any."""
        length = segment.length()
        at = stop + 1
        while at < length:
            buf = segment.read(at, min(_CHUNK_BYTES + fmt.RECORD_HEADER_BYTES, length - at))
            found = _next_magic(buf, 4)
            while found >= 0:
                candidate = at + found - 4
                data = (
                    segment.read(candidate, length - candidate)
                    if length - candidate < _CHUNK_BYTES
                    else None
                )
                probe = data if data is not None else segment.read(candidate, _CHUNK_BYTES)
                _, problem, _ = rec.check_at(probe, 0, segment.start + candidate)
                if problem is None:
                    return segment.start + candidate
                found = _next_magic(buf, found + 1)
            at += max(1, len(buf) - fmt.RECORD_HEADER_BYTES)
        if nxt is not None:
            head = nxt.read(0, _CHUNK_BYTES)
            _, problem, _ = rec.check_at(head, 0, nxt.start)
            if problem in (None, rec.RecordProblem.TRUNCATED):
                return nxt.start
        return None

    def _cut(self, segment: Segment, stop: int) -> int:
        end = segment.start + stop
        if not self.repair:
            return end
        dropped = segment.length() - stop
        later = [s for s in self.log.files.segments if s.start > segment.start]
        dropped += sum(s.length() for s in later)
        if dropped:
            self.report.truncated_at = end
            self.report.truncated_bytes = dropped
            segment.truncate(stop)
            segment.sync()
            self.report.removed_segments = [
                s.path.name for s in self.log.files.remove_from(segment.start + 1)
            ]
            log.warning("torn CommitLog tail: dropped %d bytes from offset %d", dropped, end)
        return end


def recover(
    commitlog: CommitLog,
    queues: ConsumeQueueStore,
    index: IndexService | None,
    checkpoint: Checkpoint | None,
    queue_table: dict[tuple[str, int], int],
    crashed: bool,
) -> RecoveryReport:
    """Bring the CommitLog, consume queues and index to one consistent state."""
    report = RecoveryReport(crashed=crashed, checkpoint=checkpoint)
    start = commitlog.min_offset
    if checkpoint is not None:
        start = max(start, _checked_from(commitlog, checkpoint.redispatch_from))
    report.scanned_from = start
    index_from = checkpoint.index_durable_offset if checkpoint is not None else 0
    dispatcher = _Dispatcher(queues, index, index_from, report)
    end = _Scanner(commitlog, report, repair=True).run(start, dispatcher)
    dispatcher.flush()
    commitlog.write_offset = commitlog.flushed_offset = report.end_offset = end
    drop_units_past(queues, end, report)
    for queue in queues:  # retention may have removed the log under a queue's first units
        queue.drop_below_phys(commitlog.min_offset)
    rebuild = dispatcher.needs_rebuild | _queues_shorter_than(queues, queue_table)
    if rebuild:
        _rebuild(commitlog, queues, rebuild, report)
    if index is not None:
        index.truncate_above(end)
    log.log(logging.INFO if report.lost_nothing else logging.WARNING, "%s", report.summary())
    return report


def _data_end(commitlog: CommitLog) -> int:
    last = commitlog.files.last
    return last.start + last.length() if last else 0


def _checked_from(commitlog: CommitLog, offset: int) -> int:
    """Where validation starts for a checkpoint at `offset`. A log that ends before it
    lost bytes the checkpoint vouched for (a disk that acknowledged an fsync it did not
    do, a copy cut short): its end is no known boundary, so its last segment is checked
    whole, and a torn record there is cut rather than kept."""
    end = _data_end(commitlog)
    if offset > end:
        last = commitlog.files.last
        log.warning(
            "the log ends at %d, before its checkpoint (%d); validating its last segment",
            end,
            offset,
        )
        return last.start if last is not None else end
    return _record_boundary_or_segment_start(commitlog, offset)


def _record_boundary_or_segment_start(commitlog: CommitLog, offset: int) -> int:
    """The checkpoint always names a record boundary; if the record there is not valid
    (say, the checkpoint came from another copy), fall back to its segment's start."""
    segment = commitlog.files.find(offset)
    if segment is None or offset == segment.start:
        return offset
    head = segment.read(offset - segment.start, fmt.RECORD_HEADER_BYTES)
    if len(head) < 8:
        return offset
    magic = fmt.SIZE_AND_MAGIC.unpack_from(head)[1]
    claimed = int.from_bytes(head[fmt.PHYS_OFFSET_FIELD_AT : fmt.PHYS_OFFSET_FIELD_AT + 8], "big")
    framed = magic in (fmt.MESSAGE_MAGIC, fmt.BATCH_MAGIC)
    if magic == fmt.BLANK_MAGIC or (framed and claimed == offset):
        return offset
    log.warning(
        "checkpoint offset %d is not a record boundary; validating its whole segment", offset
    )
    return segment.start


def drop_units_past(queues: ConsumeQueueStore, end: int, report: RecoveryReport) -> None:
    for queue in queues:
        cut = queue.max_offset
        while cut > queue.min_offset:
            unit = queue.unit_at(cut - 1)
            if unit is None or (not unit.is_hole and unit.phys_offset + unit.size <= end):
                break
            cut -= 1
        report.stale_units_dropped += queue.truncate(cut)


def _queues_shorter_than(
    queues: ConsumeQueueStore, table: dict[tuple[str, int], int]
) -> set[tuple[str, int]]:
    short = set()
    for key, expected_end in table.items():
        queue = queues.find(*key)
        if queue is None or queue.max_offset < expected_end:
            short.add(key)
    return short


def _rebuild(
    commitlog: CommitLog,
    queues: ConsumeQueueStore,
    keys: set[tuple[str, int]],
    report: RecoveryReport,
) -> None:
    report.queues_rebuilt = sorted(f"{t}/{q}" for t, q in keys)
    log.warning(
        "rebuilding consume queues from the whole log: %s", ", ".join(report.queues_rebuilt)
    )
    dispatcher = _Dispatcher(queues, None, 0, report, only=set(keys))
    _Scanner(commitlog, report, repair=False).run(commitlog.min_offset, dispatcher)
    dispatcher.flush()


def catch_up(
    commitlog: CommitLog, queues: ConsumeQueueStore, index: IndexService | None, start: int
) -> set[tuple[str, int]]:
    """Dispatch records from `start` that the append path failed to dispatch (or that a
    slave copied); the (topic, queue id) of every queue that got a unit."""
    report = RecoveryReport(crashed=False, checkpoint=None)
    dispatcher = _Dispatcher(queues, index, start, report)
    _Scanner(commitlog, report, repair=False).run(start, dispatcher)
    dispatcher.flush()
    return dispatcher.touched
