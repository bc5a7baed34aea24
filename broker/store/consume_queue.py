"""ConsumeQueues: per (topic, queue), the list of where each message sits in the CommitLog.

A queue is a logical file of 20-byte units (format.CQ_UNIT) cut into segments; logical
offset N is unit N. Queues are derived data: the dispatch routine builds them from the
CommitLog, so recovery can always rebuild them. They are written with pwrite and made
durable by the checkpoint routine, never on the append path.
"""

from __future__ import annotations

import logging
import pathlib
import shutil
import threading
from collections.abc import Iterator
from typing import NamedTuple

from capstan.broker.store import format as fmt
from capstan.broker.store.segments import Segment, SegmentDirectory

log = logging.getLogger(__name__)

_UNIT = fmt.CQ_UNIT
_UNIT_BYTES = fmt.CQ_UNIT_BYTES
_HOLE = bytes(_UNIT_BYTES)


class Unit(NamedTuple):
    """One consume-queue entry."""

    phys_offset: int
    size: int
    tag_hash: int

    @property
    def is_hole(self) -> bool:
        return self.size == 0


class ConsumeQueue:
    """The units of one (topic, queue_id)."""

    def __init__(self, directory: pathlib.Path, topic: str, queue_id: int, units_per_segment: int):
        self.topic = topic
        self.queue_id = queue_id
        self.files = SegmentDirectory(directory, units_per_segment * _UNIT_BYTES)
        self._lock = threading.Lock()
        self.dirty = False
        self._cut_partial_unit()
        last = self.files.last
        self.max_offset = (last.start + last.length()) // _UNIT_BYTES if last else 0
        self.min_offset = self._first_unit_offset()

    def _cut_partial_unit(self) -> None:
        last = self.files.last
        if last is None:
            return
        length = last.length()
        if length % _UNIT_BYTES:
            log.warning(
                "%s ends in a partial unit (%d bytes); cutting it off",
                last.path,
                length % _UNIT_BYTES,
            )
            last.truncate(length - length % _UNIT_BYTES)

    def _first_unit_offset(self) -> int:
        """The first offset holding a message: leading holes (a queue rebuilt from the middle
        of a segment) do not count."""
        for segment in self.files.segments:
            data = segment.read(0, segment.length())
            stripped = len(data) - len(data.lstrip(b"\0"))
            if stripped < len(data):
                return (segment.start + stripped - stripped % _UNIT_BYTES) // _UNIT_BYTES
        return self.max_offset

    # -- writing (the dispatcher holds the store's append lock) -------------------------

    def append(self, first_offset: int, units: bytes) -> None:
        """Write packed units starting at logical `first_offset` (at or after the end)."""
        if first_offset < self.max_offset:
            raise ValueError(
                f"{self.topic}/{self.queue_id}: {first_offset} < end {self.max_offset}"
            )
        if self.max_offset == self.min_offset:
            self.min_offset = first_offset
        position = first_offset * _UNIT_BYTES
        view = memoryview(units)
        while view:
            segment = self._segment_for_write(position)
            room = segment.start + self.files.segment_bytes - position
            segment.write(position - segment.start, view[:room])
            position += min(room, len(view))
            view = view[room:]
        with self._lock:
            self.max_offset = position // _UNIT_BYTES
            self.dirty = True

    def _segment_for_write(self, position: int) -> Segment:
        segment = self.files.find(position)
        if segment is None:
            segment = self.files.create(self.files.segment_start(position))
        return segment

    def truncate(self, offset: int) -> int:
        """Forget units at and after logical `offset`; return how many were dropped."""
        if offset >= self.max_offset:
            return 0
        dropped = self.max_offset - offset
        position = offset * _UNIT_BYTES
        self.files.remove_from(self.files.segment_start(position) + self.files.segment_bytes)
        segment = self.files.find(position)
        if segment is not None:
            segment.truncate(position - segment.start)
            if position == segment.start:
                self.files.remove(segment)
        with self._lock:
            self.max_offset = offset
            self.min_offset = min(self.min_offset, offset)
            self.dirty = True
        return dropped

    def sync(self) -> None:
        with self._lock:
            dirty, self.dirty = self.dirty, False
        if dirty:
            for segment in self.files.segments[-2:]:
                segment.sync()

    # -- reading -----------------------------------------------------------------------

    def read(self, offset: int, max_units: int) -> list[Unit]:
        """Up to `max_units` units from logical `offset`, within one segment."""
        return [Unit._make(u) for u in self.read_raw(offset, max_units)]

    def read_raw(self, offset: int, max_units: int) -> list[tuple[int, int, int]]:
        """`read` as plain (phys_offset, size, tag_hash) tuples, for the hot read path."""
        end = min(self.max_offset, offset + max_units)
        if offset < self.min_offset or offset >= end:
            return []
        position = offset * _UNIT_BYTES
        segment = self.files.find(position)
        if segment is None:
            return []
        room = segment.start + self.files.segment_bytes - position
        data = segment.read(position - segment.start, min(room, (end - offset) * _UNIT_BYTES))
        usable = len(data) - len(data) % _UNIT_BYTES
        return list(_UNIT.iter_unpack(data[:usable] if usable != len(data) else data))

    def unit_at(self, offset: int) -> Unit | None:
        units = self.read(offset, 1)
        return units[0] if units else None

    def last_unit(self) -> Unit | None:
        return self.unit_at(self.max_offset - 1) if self.max_offset > self.min_offset else None

    # -- retention ---------------------------------------------------------------------

    def drop_below_phys(self, commitlog_min: int) -> int:
        """Move the minimum past units whose message the CommitLog no longer holds, and
        delete segments made entirely of them. Returns the new minimum."""
        low, high = self.min_offset, self.max_offset
        while low < high:
            mid = (low + high) // 2
            found = self.next_message_unit(mid, high)
            if found is None or found[1].phys_offset >= commitlog_min:
                high = mid  # holes take the fate of the next real unit; trailing ones stay
            else:
                low = found[0] + 1
        with self._lock:
            self.min_offset = low
        keep_from = self.files.segment_start(low * _UNIT_BYTES)
        for segment in list(self.files.segments):
            if segment.start < keep_from and segment is not self.files.last:
                self.files.remove(segment)
        return low

    def next_message_unit(self, offset: int, end: int) -> tuple[int, Unit] | None:
        """The first unit at or after `offset` (before `end`) that is not a hole."""
        while offset < end:
            units = self.read(offset, min(end - offset, 1024))
            if not units:
                return None
            for i, unit in enumerate(units):
                if not unit.is_hole:
                    return offset + i, unit
            offset += len(units)
        return None

    def close(self) -> None:
        self.files.close()


class ConsumeQueueStore:
    """Every consume queue of the broker, under `<root>/<topic>/<queue_id>/`."""

    def __init__(self, root: pathlib.Path, units_per_segment: int) -> None:
        self.root = root
        self.units_per_segment = units_per_segment
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
        self._load()

    def _load(self) -> None:
        for topic_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for queue_dir in sorted(p for p in topic_dir.iterdir() if p.is_dir()):
                if queue_dir.name.isdigit():
                    key = (topic_dir.name, int(queue_dir.name))
                    self._queues[key] = ConsumeQueue(queue_dir, *key, self.units_per_segment)

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        queue = self._queues.get((topic, queue_id))
        if queue is None:
            with self._lock:
                queue = self._queues.get((topic, queue_id))
                if queue is None:
                    directory = self.root / topic / str(queue_id)
                    queue = ConsumeQueue(directory, topic, queue_id, self.units_per_segment)
                    self._queues[(topic, queue_id)] = queue
        return queue

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self._queues.values()))

    def queues_of(self, topic: str) -> list[ConsumeQueue]:
        return sorted(
            (q for (t, _), q in self._queues.items() if t == topic), key=lambda q: q.queue_id
        )

    def dispatch(self, entries: list[tuple[str, int, int, int, int, int]]) -> None:
        """Append units for (topic, queue_id, queue_offset, phys_offset, size, tag_hash)
        entries, in log order. The caller holds the store's append lock."""
        batches: dict[tuple[str, int], tuple[int, list[bytes]]] = {}
        pack = _UNIT.pack
        for topic, queue_id, queue_offset, phys, size, tags in entries:
            batch = batches.get((topic, queue_id))
            if batch is None:
                batch = batches[(topic, queue_id)] = (queue_offset, [])
            batch[1].append(pack(phys, size, tags))
        for (topic, queue_id), (first, units) in batches.items():
            self.get_or_create(topic, queue_id).append(first, b"".join(units))

    def sync(self) -> None:
        for queue in self:
            queue.sync()

    def delete_topic(self, topic: str) -> None:
        for queue in self.queues_of(topic):
            queue.close()
            del self._queues[(topic, queue.queue_id)]
        shutil.rmtree(self.root / topic, ignore_errors=True)

    def close(self) -> None:
        for queue in self:
            queue.close()
        self._queues.clear()


def hole_units(count: int) -> bytes:
    """`count` hole units, for queue offsets whose message is lost."""
    return _HOLE * count
