"""Applying a compaction job's manifest to a topic of this broker (its compacted copy:
compaction.py).

`CompactionSession` checks every kept record against what this broker stores (same topic,
queue, offset, key and body CRC), copies it byte for byte into a new generation of the
topic's compacted copy, and has the generation swapped in with one atomic rename; on any
error it leaves the topic exactly as it was.
"""

from __future__ import annotations

import os
import pathlib
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from capstan.broker.store import record as rec
from capstan.broker.store.compaction import (
    UNIT,
    CompactionRefused,
    is_compact,
)
from capstan.broker.store.message import tag_hash
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.properties import PROPERTY_KEYS
from capstan.broker.store.topic_config import TopicConfig
from capstan.common.compaction_manifest import KeptRecord, ManifestDigest, QueueCut

BUSY_WAIT_S = 20.0
"""How long a manifest waits for another swap of the same topic here (a slave adopting
its master's copy, or a second job) before it is refused."""


@dataclass(frozen=True, slots=True)
class QueueOutcome:
    queue_id: int
    boundary: int
    kept: int
    dropped: int
    bytes: int


class _QueueWriter:
    """Writes one queue's files of a generation being built."""

    def __init__(self, directory: pathlib.Path, queue_id: int, boundary: int) -> None:
        self.queue_id = queue_id
        self.boundary = boundary
        self.records = (directory / f"{queue_id}.records").open("wb")
        self.units = (directory / f"{queue_id}.units").open("wb")
        self.position = 0
        self.kept = 0
        self.records_crc = 0
        self.units_crc = 0

    def add(self, queue_offset: int, data: bytes, tags: int) -> None:
        unit = UNIT.pack(queue_offset, self.position, len(data), tags)
        self.records.write(data)
        self.units.write(unit)
        self.records_crc = zlib.crc32(data, self.records_crc)
        self.units_crc = zlib.crc32(unit, self.units_crc)
        self.position += len(data)
        self.kept += 1

    def finish(self) -> dict[str, int]:
        for f in (self.records, self.units):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return {
            "boundary": self.boundary,
            "kept": self.kept,
            "records_bytes": self.position,
            "records_crc": self.records_crc,
            "units_crc": self.units_crc,
        }

    def close(self) -> None:
        self.records.close()
        self.units.close()


class CompactionSession:
    """One manifest being applied to a topic of this broker.

    `add` checks and copies kept records as they arrive; `finish` compares the digest and
    swaps; `abandon` (also on any error) leaves the topic exactly as it was."""

    def __init__(self, store: MessageStore, topic: str, cuts: list[QueueCut], job: str) -> None:
        config = store.topics.get(topic)
        if config is None:
            raise CompactionRefused(f"no topic {topic} on this broker")
        if not is_compact(config):
            raise CompactionRefused(f"topic {topic} is not compact (cleanup.policy)")
        if not cuts:
            raise CompactionRefused("the manifest cuts no queue")
        self.digest = ManifestDigest(topic, cuts)
        self.store = store
        self.topic = topic
        self.job = job
        compacted = store.compacted
        self._gen_dir = compacted.begin(topic, job, cuts, BUSY_WAIT_S)
        self._open = True
        self._lock = threading.Lock()
        """add, finish and abandon take turns: a cancelled call abandons from the event
        loop while a batch may still be copied on a worker thread."""
        try:
            # Read once the topic is ours: a swap waited for above may have changed it.
            self._old = compacted.views(topic)
            for cut in cuts:
                self._check_cut(config, cut)
            self._writers = {
                cut.queue_id: _QueueWriter(self._gen_dir, cut.queue_id, cut.boundary)
                for cut in cuts
            }
        except BaseException:
            self.abandon()
            raise

    def _check_cut(self, config: TopicConfig, cut: QueueCut) -> None:
        if not 0 <= cut.queue_id < config.queue_dir_count:
            raise CompactionRefused(f"{self.topic} has no queue {cut.queue_id}")
        bounds = self.store.queue_bounds(self.topic, cut.queue_id) or (0, 0)
        if cut.boundary > bounds[1]:
            raise CompactionRefused(
                f"queue {cut.queue_id} ends at {bounds[1]} here, below the cut "
                f"{cut.boundary} (this replica is behind the one the job read)"
            )
        old = self._old.get(cut.queue_id)
        if old is not None and cut.boundary < old.boundary:
            raise CompactionRefused(
                f"queue {cut.queue_id} is already compacted up to {old.boundary}, "
                f"past the cut {cut.boundary} (a newer compaction finished first)"
            )

    def add(self, records: Iterable[KeptRecord]) -> None:
        with self._lock:
            self._add(records)

    def _add(self, records: Iterable[KeptRecord]) -> None:
        if not self._open:
            raise CompactionRefused("this compaction was abandoned")
        try:
            for kept in records:
                self.digest.add(kept)
                data, tags = self._locate(kept)
                self._writers[kept.queue_id].add(kept.queue_offset, data, tags)
        except BaseException:
            self._abandon()
            raise

    def _locate(self, kept: KeptRecord) -> tuple[bytes, int]:
        """The stored bytes of a kept record, checked against the manifest, and its tag
        hash."""
        where = f"{self.topic} queue {kept.queue_id} offset {kept.queue_offset}"
        old = self._old.get(kept.queue_id)
        if old is not None and kept.queue_offset < old.boundary:
            i = old.find(kept.queue_offset)
            if i is None:
                raise CompactionRefused(f"{where} was dropped by an earlier compaction")
            data: bytes | None = old.record_bytes(i, i)
        else:
            data = self.store.stored_record(self.topic, kept.queue_id, kept.queue_offset)
        if data is None:
            raise CompactionRefused(f"{where} is not stored here (removed or a hole)")
        try:
            message = rec.decode(data)
        except rec.CorruptRecord as exc:
            raise CompactionRefused(f"{where}: {exc}") from None
        if (message.topic, message.queue_id, message.queue_offset) != (
            self.topic,
            kept.queue_id,
            kept.queue_offset,
        ):
            raise CompactionRefused(f"{where}: the record stored there is another one")
        key = message.properties.get(PROPERTY_KEYS, "")
        if key != kept.key or message.body_crc != kept.body_crc:
            raise CompactionRefused(
                f"{where}: the manifest says key {kept.key!r} CRC {kept.body_crc}, the "
                f"record has key {key!r} CRC {message.body_crc}"
            )
        return data, tag_hash(message.tags)

    def finish(self, sha256: str, count: int) -> tuple[int, list[QueueOutcome]]:
        """Swap if the manifest is whole: its digest and record count match."""
        with self._lock:
            return self._finish(sha256, count)

    def _finish(self, sha256: str, count: int) -> tuple[int, list[QueueOutcome]]:
        if not self._open:
            raise CompactionRefused("this compaction was abandoned")
        try:
            if count != self.digest.count or sha256 != self.digest.hexdigest():
                raise CompactionRefused(
                    f"the manifest does not match its checksum ({self.digest.count} records "
                    f"received, {count} announced): nothing was changed"
                )
            metas = {q: w.finish() for q, w in self._writers.items()}
            before = {q: self._deliverable(q, m["boundary"]) for q, m in metas.items()}
            generation = self.store.compacted.commit(self.topic, self._gen_dir, metas, self.job)
        except BaseException:
            self._abandon()
            raise
        self._open = False
        self.store.compacted.end(self.topic)
        outcomes = [
            QueueOutcome(q, m["boundary"], m["kept"], before[q] - m["kept"], m["records_bytes"])
            for q, m in sorted(metas.items())
        ]
        return generation, outcomes

    def _deliverable(self, queue_id: int, boundary: int) -> int:
        """How many records below `boundary` were delivered before this swap."""
        old = self._old.get(queue_id)
        low = self.store.consume_queue_min(self.topic, queue_id)
        if old is None:
            return max(0, boundary - low)
        return old.kept + max(0, boundary - max(old.boundary, low))

    def abandon(self) -> None:
        """Drop what was built; the topic stays exactly as it was. No-op once swapped."""
        with self._lock:
            self._abandon()

    def _abandon(self) -> None:
        if not self._open:
            return
        self._open = False
        for writer in getattr(self, "_writers", {}).values():
            writer.close()
        self.store.compacted.abandon(self.topic, self._gen_dir)
