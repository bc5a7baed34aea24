"""Compacted copies of compact topics: the records a compaction kept, outside the CommitLog.

A topic whose `cleanup.policy` attribute is COMPACT (or RocketMQ's COMPACTION) keeps the
latest record of each key. A compaction job decides which records those are and sends a
manifest (capstan/common/compaction_manifest.py); `CompactionSession` checks every kept
record against what this broker stores (same topic, queue, offset, key and body CRC),
copies it byte for byte into a new generation of the topic's compacted copy, and swaps the
generation in with one atomic rename. From then on reads of a queue below its boundary are
answered from the copy: kept records keep their queue offsets and message ids, dropped ones
are gaps. The CommitLog's copies of them stop pinning the log, so retention deletes their
segments (see MessageStore.retention_floors).

Layout, under `<store>/compacted/<topic>/`:

  CURRENT                  JSON, replaced atomically: the live generation and, per queue,
                           its boundary, kept count and the CRC-32 of its two files
  gen-<N>/<queue>.records  the kept records, as the CommitLog stored them, in offset order
  gen-<N>/<queue>.units    per kept record `UNIT`: queue offset, position in .records,
                           size, tag hash

A generation directory that CURRENT does not name is a swap that never happened (a job or
broker killed before the rename) or one that was replaced; loading deletes it.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import pathlib
import shutil
import struct
import threading
import zlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from capstan.broker.store import record as rec
from capstan.broker.store.message import tag_hash
from capstan.broker.store.properties import PROPERTY_KEYS
from capstan.broker.store.topic_config import CLEANUP_POLICY, TopicConfig
from capstan.common.compaction_manifest import KeptRecord, ManifestDigest, QueueCut
from capstan.common.durable_files import replace_durably, sync_directory

if TYPE_CHECKING:
    from capstan.broker.store.message_store import MessageStore

log = logging.getLogger(__name__)

_COMPACT_POLICIES = {"COMPACT", "COMPACTION"}
UNIT = struct.Struct(">qqiq")
CURRENT = "CURRENT"


def is_compact(config: TopicConfig | None) -> bool:
    """Whether a topic keeps the latest record per key (its cleanup policy is compact)."""
    return (
        config is not None
        and config.attributes.get(CLEANUP_POLICY, "").upper() in _COMPACT_POLICIES
    )


class CompactionRefused(Exception):
    """The manifest does not fit this broker's data; nothing was changed."""


class AlreadyCompacted(Exception):
    """This broker's live copy of the topic is already the one the job makes: a slave
    took it from its master (adoption) before the job's manifest reached it."""

    def __init__(self, topic: str, job: str, generation: int) -> None:
        super().__init__(f"{topic} already holds job {job}'s copy (generation {generation})")
        self.generation = generation


BUSY_WAIT_S = 20.0
"""How long a manifest waits for another swap of the same topic here (a slave adopting
its master's copy, or a second job) before it is refused."""


class CompactedQueue:
    """One queue's compacted copy: kept records below `boundary`, read-only."""

    def __init__(self, queue_id: int, boundary: int, records: pathlib.Path, units: bytes):
        self.queue_id = queue_id
        self.boundary = boundary
        self.offsets = array("q")
        self.positions = array("q")
        self.sizes = array("i")
        self.tags = array("q")
        for offset, position, size, tags in UNIT.iter_unpack(units):
            self.offsets.append(offset)
            self.positions.append(position)
            self.sizes.append(size)
            self.tags.append(tags)
        self.fd = os.open(records, os.O_RDONLY)

    @property
    def kept(self) -> int:
        return len(self.offsets)

    @property
    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def low(self, queue_min: int) -> int:
        """The queue's first readable offset, given the consume queue's minimum."""
        return self.offsets[0] if self.offsets else max(self.boundary, queue_min)

    def index_from(self, offset: int) -> int:
        """Index of the first kept record at or after `offset`."""
        return bisect.bisect_left(self.offsets, offset)

    def find(self, offset: int) -> int | None:
        i = self.index_from(offset)
        return i if i < len(self.offsets) and self.offsets[i] == offset else None

    def record_bytes(self, first: int, last: int) -> bytes:
        """The records of kept indexes first..last (inclusive), which are contiguous."""
        start = self.positions[first]
        end = self.positions[last] + self.sizes[last]
        return os.pread(self.fd, end - start, start)

    def close(self) -> None:
        os.close(self.fd)


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


class CompactedTopics:
    """Every compacted copy of this broker, and the swap that replaces one."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._views: dict[str, dict[int, CompactedQueue]] = {}
        self._generations: dict[str, int] = {}
        self._jobs: dict[str, str] = {}
        """The job that made each topic's live generation (adopted copies keep it)."""
        self._busy: set[str] = set()
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)
        self._retired: list[CompactedQueue] = []
        self.version = 0
        """Rises with every swap, adoption or deletion: a master sends its slaves the
        generations when it moved (replication/state_copy.py)."""
        for topic_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            self._load(topic_dir)

    def _load(self, topic_dir: pathlib.Path) -> None:
        topic = topic_dir.name
        current = _read_current(topic_dir)
        generation = current["generation"] if current else 0
        for stray in topic_dir.iterdir():
            if stray.name != CURRENT and stray.name != _gen_name(generation):
                log.info("compaction: removing %s (a swap that did not happen)", stray)
                _remove(stray)
        if current is None:
            return
        views = {}
        gen_dir = topic_dir / _gen_name(generation)
        for key, meta in current["queues"].items():
            queue_id = int(key)
            try:
                views[queue_id] = _open_queue(gen_dir, queue_id, meta)
            except (OSError, ValueError) as exc:
                log.error(
                    "compaction: the compacted copy of %s queue %d is unusable (%s); "
                    "its reads fall back to the CommitLog",
                    topic,
                    queue_id,
                    exc,
                )
        self._views[topic] = views
        self._generations[topic] = generation
        self._jobs[topic] = str(current.get("job", ""))

    # -- reading -----------------------------------------------------------------------

    def view(self, topic: str, queue_id: int) -> CompactedQueue | None:
        views = self._views.get(topic)
        return None if views is None else views.get(queue_id)

    def views(self, topic: str) -> dict[int, CompactedQueue]:
        return dict(self._views.get(topic, {}))

    def generation(self, topic: str) -> int:
        return self._generations.get(topic, 0)

    def generations(self) -> dict[str, int]:
        return dict(self._generations)

    def current_files(self, topic: str, generation: int) -> tuple[bytes, list[pathlib.Path]]:
        """The CURRENT document and the files of `generation` of a topic's copy, for a
        slave; ValueError when the live generation is another one."""
        if self.generation(topic) != generation or generation == 0:
            raise ValueError(
                f"{topic}: the compacted copy here is generation {self.generation(topic)}, "
                f"not {generation}"
            )
        topic_dir = self.root / topic
        gen_dir = topic_dir / _gen_name(generation)
        return (topic_dir / CURRENT).read_bytes(), sorted(gen_dir.iterdir())

    def adopt(self, topic: str, document: dict[str, Any], files: dict[str, bytes]) -> bool:
        """Install a master's copy of `topic` (its CURRENT document and files) in place of
        an older one here; False when this one is as new, or a compaction runs here now.
        Files are checked against the document before it becomes CURRENT."""
        generation = int(document["generation"])
        if generation <= self.generation(topic):
            return False
        with self._lock:
            if topic in self._busy:
                return False
            self._busy.add(topic)
        topic_dir = self.root / topic
        gen_dir = topic_dir / _gen_name(generation)
        try:
            _remove(gen_dir)
            gen_dir.mkdir(parents=True)
            for name, data in files.items():
                if "/" in name or not name.endswith((".records", ".units")):
                    raise ValueError(f"{topic}: unexpected file {name!r} in a copy")
                with (gen_dir / name).open("wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
            sync_directory(gen_dir)
            sync_directory(topic_dir)
            views = {
                int(q): _open_queue(gen_dir, int(q), meta) for q, meta in document["queues"].items()
            }
        except BaseException:
            _remove(gen_dir)
            self.end(topic)
            raise
        replace_durably(topic_dir / CURRENT, json.dumps(document, indent=1).encode())
        with self._lock:
            self._retired.extend(self._views.get(topic, {}).values())
            self._views[topic] = views
            self._generations[topic] = generation
            self._jobs[topic] = str(document.get("job", ""))
            self._busy.discard(topic)
            self._free.notify_all()
            self.version += 1
        for stray in topic_dir.iterdir():
            if stray.name not in (CURRENT, gen_dir.name):
                _remove(stray)
        return True

    def topics(self) -> list[str]:
        return sorted(self._views)

    def bytes_of(self, topic: str) -> int:
        return sum(v.size for v in self._views.get(topic, {}).values())

    # -- swapping ----------------------------------------------------------------------

    def begin(
        self, topic: str, job: str = "", cuts: Iterable[QueueCut] = (), wait_s: float = 0.0
    ) -> pathlib.Path:
        """Reserve the topic for one session and make the next generation's directory.

        Another swap of the topic here (an adoption, a second job) is waited for up to
        `wait_s`; AlreadyCompacted when the live generation is `job`'s own, at `cuts`."""
        with self._lock:
            if not self._free.wait_for(lambda: topic not in self._busy, timeout=wait_s):
                raise CompactionRefused(
                    f"a compaction of {topic} is already running here (still after {wait_s:.0f} s)"
                )
            live = {q: v.boundary for q, v in self._views.get(topic, {}).items()}
            if (
                job
                and self._jobs.get(topic) == job
                and all(live.get(c.queue_id) == c.boundary for c in cuts)
            ):
                raise AlreadyCompacted(topic, job, self._generations.get(topic, 0))
            self._busy.add(topic)
        topic_dir = self.root / topic
        gen_dir = topic_dir / _gen_name(self.generation(topic) + 1)
        try:
            _remove(gen_dir)
            gen_dir.mkdir(parents=True)
        except OSError:
            self.end(topic)
            raise
        return gen_dir

    def end(self, topic: str) -> None:
        with self._lock:
            self._busy.discard(topic)
            self._free.notify_all()

    def abandon(self, topic: str, gen_dir: pathlib.Path) -> None:
        _remove(gen_dir)
        self.end(topic)

    def commit(
        self, topic: str, gen_dir: pathlib.Path, queues: dict[int, dict[str, int]], job: str
    ) -> int:
        """Make `gen_dir` the live generation: fsync it, rename CURRENT over, open the
        views, retire the old ones. Queues it does not name keep their copy (linked in)."""
        generation = self.generation(topic) + 1
        old = self._views.get(topic, {})
        old_dir = self.root / topic / _gen_name(generation - 1)
        metas = dict(queues)
        previous = _read_current(self.root / topic)
        for queue_id in old:
            if queue_id not in metas and previous is not None:
                for suffix in ("records", "units"):
                    os.link(old_dir / f"{queue_id}.{suffix}", gen_dir / f"{queue_id}.{suffix}")
                metas[queue_id] = previous["queues"][str(queue_id)]
        sync_directory(gen_dir)
        sync_directory(gen_dir.parent)
        document = {
            "topic": topic,
            "generation": generation,
            "job": job,
            "queues": {str(q): m for q, m in sorted(metas.items())},
        }
        replace_durably(self.root / topic / CURRENT, json.dumps(document, indent=1).encode())
        views = {q: _open_queue(gen_dir, q, m) for q, m in metas.items()}
        with self._lock:
            self._views[topic] = views
            self._generations[topic] = generation
            self._jobs[topic] = job
            self._retired.extend(old.values())
            self.version += 1
        if generation > 1:
            _remove(old_dir)
        return generation

    def release_retired(self) -> None:
        """Close descriptors of replaced copies (reads that held them have finished)."""
        with self._lock:
            retired, self._retired = self._retired, []
        for view in retired:
            view.close()

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            views = self._views.pop(topic, {})
            self._generations.pop(topic, None)
            self._jobs.pop(topic, None)
            self._retired.extend(views.values())
            self.version += 1
        _remove(self.root / topic)

    def close(self) -> None:
        with self._lock:
            for views in self._views.values():
                self._retired.extend(views.values())
            self._views.clear()
        self.release_retired()


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


def _gen_name(generation: int) -> str:
    return f"gen-{generation:08d}"


def _read_current(topic_dir: pathlib.Path) -> dict[str, Any] | None:
    path = topic_dir / CURRENT
    try:
        document = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise OSError(f"{path} is unreadable ({exc}); move it aside to drop the copy") from exc
    if not isinstance(document, dict) or not isinstance(document.get("queues"), dict):
        raise OSError(f"{path} is not a compaction state document")
    return document


def _open_queue(gen_dir: pathlib.Path, queue_id: int, meta: dict[str, int]) -> CompactedQueue:
    units = (gen_dir / f"{queue_id}.units").read_bytes()
    records = gen_dir / f"{queue_id}.records"
    if len(units) != meta["kept"] * UNIT.size or zlib.crc32(units) != meta["units_crc"]:
        raise ValueError(f"{queue_id}.units does not match its CRC or size")
    if records.stat().st_size != meta["records_bytes"]:
        raise ValueError(
            f"{queue_id}.records is {records.stat().st_size} bytes, not {meta['records_bytes']}"
        )
    return CompactedQueue(queue_id, meta["boundary"], records, units)


def _remove(path: pathlib.Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
