"""Compacted copies of compact topics: the records a compaction kept, outside the CommitLog.

A topic whose `cleanup.policy` attribute is COMPACT (or RocketMQ's COMPACTION) keeps the
latest record of each key. A compaction job decides which records those are and sends a
manifest (capstan/common/compaction_manifest.py); `CompactionSession`
(compaction_session.py) checks every kept record against what this broker stores, copies it
byte for byte into a new generation of the topic's compacted copy, and `CompactedTopics`
here swaps the generation in with one atomic rename. From then on reads of a queue below
its boundary are answered from the copy: kept records keep their queue offsets and message
ids, dropped ones are gaps. The CommitLog's copies of them stop pinning the log, so
retention deletes their segments (see MessageStore.retention_floors).

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
from typing import Any

from capstan.broker.store.topic_config import CLEANUP_POLICY, TopicConfig
from capstan.common.compaction_manifest import QueueCut
from capstan.common.durable_files import replace_durably, sync_directory

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
