"""What each consumer group has received and not yet acknowledged, kept in a journal.

Per (group, topic, queue) the broker keeps `next_offset`, the first offset never handed
out, and the in-flight table: offset -> (handle sequence number, when it becomes visible
again, delivery attempt). Everything below `next_offset` that is not in flight is done.

Every change is one text line appended to `pop/journal.<generation>`, written before the
client is answered, so a killed broker (kill -9) replays exactly what it had told clients;
the journal is fsynced every `journal_sync_interval_ms` against machine crashes. When it
grows past `journal_compact_bytes`, the whole state is written as `pop/snapshot.json`
with the next generation number and a fresh journal starts. Lines:

    N group topic queue next_offset          next offset moved
    P group topic queue offset seq visible_at_ms attempt   handed out (or handle changed)
    A group topic queue offset               acknowledged (or moved to the DLQ)
    R group topic queue offset               offset reset: in-flight dropped

Names cannot contain spaces (topic and group names are `[A-Za-z0-9_%|-]+`). A torn last
line, from a crash mid-write, is ignored.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capstan.common.disk_full import is_disk_full
from capstan.common.durable_files import replace_durably, sync_directory

log = logging.getLogger(__name__)

QueueKey = tuple[str, str, int]
"""(group, topic, queue_id)"""

_SNAPSHOT = "snapshot.json"
ADOPTIONS_KEPT_S = 10.0
CHANGES_KEPT = 4096
"""Journal writes a master keeps in memory, so a slave a little behind gets the lines it
lacks rather than the whole state."""
_NEVER = 1 << 62


@dataclass(slots=True)
class InFlight:
    seq: int
    visible_at_ms: int
    attempt: int


@dataclass(slots=True)
class QueuePop:
    next_offset: int
    inflight: dict[int, InFlight] = field(default_factory=dict)
    next_due_ms: int = _NEVER
    """No in-flight entry becomes visible before this (a lower bound kept up to date)."""

    @property
    def ack_offset(self) -> int:
        """The offset a group has consumed up to: everything below it is done."""
        return min(self.inflight) if self.inflight else self.next_offset

    def recompute_due(self) -> None:
        self.next_due_ms = min((e.visible_at_ms for e in self.inflight.values()), default=_NEVER)


class PopState:
    """In-flight bookkeeping for every group, with its journal. Not thread-safe: the
    broker uses it from its event loop."""

    def __init__(self, directory: Path, compact_bytes: int) -> None:
        self._dir = directory
        self._dir.mkdir(parents=True, exist_ok=True)
        self._compact_bytes = compact_bytes
        self.queues: dict[QueueKey, QueuePop] = {}
        self._seq = 1
        self._generation = 0
        self._pending: list[str] = []
        self._lock = threading.Lock()  # journal fd: the sync routine runs in a thread
        self._load()
        self._fd = os.open(self._journal_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._journal_bytes = os.fstat(self._fd).st_size
        self._dirty = False
        self._failing: set[str] = set()
        """The parts (journal, compaction) whose last write failed."""
        self.version = 0
        """Rises with every change written (what a master sends its slaves on)."""
        self._adopted: collections.deque[tuple[float, int]] = collections.deque()
        """(when, the master's next handle sequence number) at each adoption of its state
        or of its changes in the last `ADOPTIONS_KEPT_S`: which hand-outs were recent."""
        self._changes: collections.deque[tuple[int, str]] = collections.deque(maxlen=CHANGES_KEPT)
        """(version, the journal lines that made it) of the last writes: consecutive
        versions, emptied when the whole state is replaced."""

    # -- loading -----------------------------------------------------------------------

    def _journal_path(self, generation: int | None = None) -> Path:
        return self._dir / f"journal.{self._generation if generation is None else generation}"

    def _load(self) -> None:
        snapshot = self._dir / _SNAPSHOT
        if snapshot.exists():
            data = json.loads(snapshot.read_text())
            self._generation = int(data["generation"])
            self._seq = int(data["seq"])
            self.queues.update(_parse_queues(data))
        path = self._journal_path()
        if path.exists():
            self._replay(path.read_bytes())
        for old in self._dir.glob("journal.*"):
            if old.name != path.name:
                old.unlink()

    def _replay(self, raw: bytes) -> None:
        lines = raw.split(b"\n")
        if lines and lines[-1]:
            log.warning("pop journal: ignoring a torn last line of %d bytes", len(lines[-1]))
        for line in lines[:-1]:
            parts = line.decode().split(" ")
            try:
                self._apply(parts)
            except (ValueError, IndexError):
                log.error("pop journal: skipping unreadable line %r", line[:200])
        for q in self.queues.values():
            q.recompute_due()

    def _apply(self, parts: list[str]) -> None:
        kind, group, topic, qid, value = parts[0], parts[1], parts[2], int(parts[3]), int(parts[4])
        key = (group, topic, qid)
        q = self.queues.get(key)
        if kind == "N":
            if q is None:
                self.queues[key] = QueuePop(value)
            else:
                q.next_offset = value
        elif kind == "P":
            if q is None:
                q = self.queues[key] = QueuePop(value + 1)
            seq, vis, att = int(parts[5]), int(parts[6]), int(parts[7])
            q.inflight[value] = InFlight(seq, vis, att)
            self._seq = max(self._seq, seq + 1)
        elif kind == "A":
            if q is not None:
                q.inflight.pop(value, None)
        elif kind == "R":
            self.queues[key] = QueuePop(value)
        else:
            raise ValueError(kind)

    # -- changes -----------------------------------------------------------------------

    def ensure(self, key: QueueKey, start_offset: int) -> QueuePop:
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = QueuePop(start_offset)
            self._pending.append(f"N {key[0]} {key[1]} {key[2]} {start_offset}\n")
        return q

    def advance(self, key: QueueKey, q: QueuePop, next_offset: int) -> None:
        if next_offset != q.next_offset:
            q.next_offset = next_offset
            self._pending.append(f"N {key[0]} {key[1]} {key[2]} {next_offset}\n")

    def issue(
        self, key: QueueKey, q: QueuePop, offset: int, visible_at_ms: int, attempt: int
    ) -> int:
        """Hand out (or re-hand out) `offset`; returns the new handle sequence number."""
        seq = self._seq
        self._seq += 1
        q.inflight[offset] = InFlight(seq, visible_at_ms, attempt)
        q.next_due_ms = min(q.next_due_ms, visible_at_ms)
        self._pending.append(
            f"P {key[0]} {key[1]} {key[2]} {offset} {seq} {visible_at_ms} {attempt}\n"
        )
        return seq

    def done(self, key: QueueKey, q: QueuePop, offset: int) -> None:
        if q.inflight.pop(offset, None) is not None:
            self._pending.append(f"A {key[0]} {key[1]} {key[2]} {offset}\n")

    def reset(self, key: QueueKey, offset: int) -> None:
        self.queues[key] = QueuePop(offset)
        self._pending.append(f"R {key[0]} {key[1]} {key[2]} {offset}\n")

    def write(self) -> None:
        """Append the changes made since the last call to the journal (before answering)."""
        if not self._pending:
            return
        data = "".join(self._pending).encode()
        with self._lock:
            try:
                _write_all(self._fd, data)
            except OSError as exc:
                # A line cut short would end the journal's replay there: cut it off. What
                # was not written stays pending, so the next write makes journal and memory
                # agree again (on a full disk, once space returns).
                os.ftruncate(self._fd, self._journal_bytes)
                self._log_failure("journal", exc)
                raise
            self._pending.clear()
            self.version += 1
            self._changes.append((self.version, data.decode()))
            self._journal_bytes += len(data)
            self._dirty = True
            self._failing.discard("journal")
        if self._journal_bytes > self._compact_bytes:
            try:
                self.compact()
            except OSError as exc:  # the journal holds every change: compaction can wait
                self._log_failure("compaction", exc)
            else:
                self._failing.discard("compaction")

    def _log_failure(self, part: str, exc: OSError) -> None:
        """Once a spell of failures of `part`: every receive and ack of the spell meets one."""
        if part not in self._failing:
            why = "the disk is full" if is_disk_full(exc) else "a write failed"
            log.error("pop state %s failed: %s (%s)", part, why, exc.strerror)
        self._failing.add(part)

    def sync(self) -> None:
        """fsync the journal (from the broker's sync routine, in a thread)."""
        with self._lock:
            if self._dirty:
                os.fsync(self._fd)
                self._dirty = False

    def export(self) -> dict[str, Any]:
        """The whole state as a JSON-ready document (a snapshot without its generation)."""
        return {
            "seq": self._seq,
            "queues": [
                {
                    "group": g,
                    "topic": t,
                    "queue": qid,
                    "next": q.next_offset,
                    "inflight": [
                        [off, e.seq, e.visible_at_ms, e.attempt] for off, e in q.inflight.items()
                    ],
                }
                for (g, t, qid), q in self.queues.items()
            ],
        }

    def replace_all(self, document: dict[str, Any]) -> None:
        """Take a master's state (`export()`) as this broker's own, durably."""
        self.queues.clear()
        self.queues.update(_parse_queues(document))
        self._seq = max(self._seq, int(document["seq"]))
        self.compact()
        self.version += 1
        self._changes.clear()
        self._adopted_now()

    def changes_since(self, version: int) -> str | None:
        """The journal lines written after `version` (empty: none), or None when they are
        no longer all kept here (the slave then needs the whole state)."""
        if version == self.version:
            return ""
        first = self._changes[0][0] if self._changes else self.version + 1
        if not first - 1 <= version < self.version:
            return None
        kept = itertools.islice(self._changes, version + 1 - first, None)
        return "".join(text for _, text in kept)

    def apply_changes(self, lines: str) -> None:
        """Take a master's journal lines (`changes_since`) as changes of this broker's own
        state, journaled like its own. An unreadable line is skipped, as at replay."""
        touched: set[QueueKey] = set()
        for line in lines.splitlines():
            parts = line.split(" ")
            try:
                self._apply(parts)
            except (ValueError, IndexError):
                log.error("pop changes from the master: skipping unreadable line %r", line[:200])
                continue
            touched.add((parts[1], parts[2], int(parts[3])))
        for key in touched:
            if (q := self.queues.get(key)) is not None:
                q.recompute_due()
        self._pending.append(lines)
        self.write()
        self._adopted_now()

    def _adopted_now(self) -> None:
        now = time.monotonic()
        self._adopted.append((now, self._seq))
        while len(self._adopted) > 1 and self._adopted[1][0] < now - ADOPTIONS_KEPT_S:
            self._adopted.popleft()

    def hand_back_recent(self, since: float, visible_at_ms: int) -> int:
        """On promotion, messages the old master handed out after `since` (a monotonic
        time: just before this broker last heard from it): the answer of the receive may
        have died with the master, so each becomes visible again by `visible_at_ms` (not at
        its own invisible time, up to minutes away), keeping its handle (a consumer that did
        get it acknowledges it as usual). How many; written to the journal."""
        older = [seq for at, seq in self._adopted if at <= since]
        first_recent = older[-1] if older else 0
        count = 0
        for key, q in self.queues.items():
            recent = [
                (offset, entry)
                for offset, entry in q.inflight.items()
                if entry.seq >= first_recent and entry.visible_at_ms > visible_at_ms
            ]
            for offset, entry in recent:
                entry.visible_at_ms = visible_at_ms
                self._pending.append(
                    f"P {key[0]} {key[1]} {key[2]} {offset} {entry.seq} {visible_at_ms} "
                    f"{entry.attempt}\n"
                )
            if recent:
                q.recompute_due()
                count += len(recent)
        return count

    def compact(self) -> None:
        """Write the whole state as a snapshot of the next generation; start a new journal."""
        self._pending.clear()  # already applied in memory, so the snapshot holds them
        generation = self._generation + 1
        data = {"generation": generation, **self.export()}
        replace_durably(self._dir / _SNAPSHOT, json.dumps(data).encode())
        with self._lock:
            old_fd, old_path = self._fd, self._journal_path()
            self._generation = generation
            self._fd = os.open(self._journal_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._journal_bytes = 0
            os.close(old_fd)
        old_path.unlink(missing_ok=True)
        sync_directory(self._dir)

    def close(self) -> None:
        try:
            self.write()
            self.sync()
        except OSError as exc:  # e.g. a full disk: messages still in flight come back sooner
            log.error("pop state changes lost at close: %s", exc.strerror)
        with self._lock:
            os.close(self._fd)


def _write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written (a filling disk may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _parse_queues(document: dict[str, Any]) -> dict[QueueKey, QueuePop]:
    queues = {}
    for item in document["queues"]:
        q = QueuePop(int(item["next"]))
        for off, seq, vis, att in item["inflight"]:
            q.inflight[int(off)] = InFlight(int(seq), int(vis), int(att))
        q.recompute_due()
        queues[(item["group"], item["topic"], int(item["queue"]))] = q
    return queues
