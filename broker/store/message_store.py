"""The message store: one broker's CommitLog, consume queues, index and config, opened,
recovered, written, read, flushed, cleaned and closed as one.

Threads: appends run under `_append_lock` (from caller threads, or on the event loop
through `AsyncAppender`); the flusher thread owns CommitLog fsyncs;
the housekeeping thread checkpoints, catches dispatch up and applies retention.
"""

from __future__ import annotations

import logging
import pathlib
import threading
import time
from collections.abc import Callable, Sequence

from capstan.broker.store import checkpoint as cp
from capstan.broker.store import format as fmt
from capstan.broker.store import record as rec
from capstan.broker.store.admission import AdmittedBatch, admit
from capstan.broker.store.commitlog import CommitLog, RecordCheck
from capstan.broker.store.compaction import CompactedQueue, CompactedTopics, is_compact
from capstan.broker.store.consume_queue import ConsumeQueue, ConsumeQueueStore
from capstan.broker.store.consumer_offsets import ConsumerOffsetStore
from capstan.broker.store.dispatch import dispatch_appended, index_key
from capstan.broker.store.flush import CommitLogFlusher
from capstan.broker.store.index import IndexService
from capstan.broker.store.message import (
    Message,
    StoredMessage,
    pack_host,
    phys_offset_of_msg_id,
    tag_hash,
)
from capstan.broker.store.queue_mappings import QueueMappingStore
from capstan.broker.store.recovery import RecoveryReport, catch_up, drop_units_past, recover
from capstan.broker.store.retention import (
    DiskUsage,
    Floors,
    RetentionOutcome,
    RetentionService,
    disk_used_ratio,
)
from capstan.broker.store.status import (
    AppendedMessage,
    GetResult,
    GetStatus,
    PutResult,
    PutStatus,
)
from capstan.broker.store.store_format import settle_store
from capstan.broker.store.subscription_groups import SubscriptionGroupStore
from capstan.broker.store.topic_config import TopicConfigStore
from capstan.broker.store.user_table import UserTable
from capstan.common.disk_full import DISK_FULL_ERRNOS, RoutineFailures, disk_full_detail
from capstan.common.store_settings import FlushMode, StoreSettings

log = logging.getLogger(__name__)

_COALESCE_READ_BYTES = 1024 * 1024
DEFAULT_GET_MAX_BYTES = 4 * 1024 * 1024
"""`get` stops before this many bytes of records (but always returns at least one)."""


def _batch_runs(records: list[rec.PreparedRecord]) -> list[int]:
    """Runs of records to store as batch records: consecutive plain messages (no
    transaction's half) of one topic and queue; every other record alone."""
    runs: list[int] = []
    key: tuple[str, int] | None = None
    for r in records:
        m = r.message
        mine = None if m.sys_flag and m.is_prepared_transaction else (m.topic, m.queue_id)
        if mine is not None and mine == key:
            runs[-1] += 1
        else:
            runs.append(1)
        key = mine
    return runs


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class MessageStore:
    """Open with `MessageStore(root, settings)`; always `close()` (or use `with`)."""

    def __init__(
        self,
        root: pathlib.Path,
        settings: StoreSettings | None = None,
        disk_usage: DiskUsage = disk_used_ratio,
    ) -> None:
        self.root = pathlib.Path(root)
        self.settings = settings or StoreSettings()
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_file = cp.StoreLock(self.root)
        try:
            settle_store(self.root)
            self._open(disk_usage)
        except BaseException:
            self._lock_file.release()
            raise

    def _open(self, disk_usage: DiskUsage) -> None:
        s = self.settings
        config = self.root / "config"
        self.topics = TopicConfigStore(config / "topics.json")
        self.subscription_groups = SubscriptionGroupStore(config / "subscriptionGroup.json")
        self.consumer_offsets = ConsumerOffsetStore(config / "consumerOffset.json")
        self.users = UserTable(config / "users.json")
        self.queue_mappings = QueueMappingStore(config / "queueMappings.json")
        host, _, port = s.store_host.rpartition(":")
        self.commitlog = CommitLog(
            self.root / "commitlog", s.commitlog_segment_bytes, pack_host(host, int(port))
        )
        self.queues = ConsumeQueueStore(
            self.root / "consumequeue", s.consume_queue_units_per_segment
        )
        self.index = IndexService(self.root / "index", s.index) if s.index_enabled else None
        self.compacted = CompactedTopics(self.root / "compacted")
        self.recovery: RecoveryReport = recover(
            self.commitlog,
            self.queues,
            self.index,
            cp.read_checkpoint(self.root),
            cp.read_queue_table(self.root),
            crashed=cp.crashed_last_time(self.root),
        )
        self._append_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        """Held from sampling the offsets to writing the files: housekeeping and a
        truncation may checkpoint at once, and they share the files' temp names."""
        self._queue_ends = self._all_queue_ends()
        self._dispatched_offset = self.commitlog.write_offset
        self.read_limit: int | None = None
        """With replication, the confirm offset: no read returns a message that does not
        end at or below it (it may vanish in a failover). None: everything is readable."""
        self._closed = False
        self._disk_full = False
        """Whether the last CommitLog write found the disk full (logged once a spell)."""
        self.damage_seen: Callable[[int], None] = lambda phys_offset: None
        """Called (from any thread) with the offset of a record a read found damaged: a
        slave's RecordHealer fetches it again from the master."""
        self._checkpoint_now()
        cp.mark_open(self.root)
        self.flusher = CommitLogFlusher(
            self.commitlog, s.flush_mode is FlushMode.SYNC_FLUSH, s.flush_interval_ms / 1000
        )
        self.retention = RetentionService(
            self.commitlog,
            self.queues,
            self.index,
            s.file_reserved_hours,
            s.disk_max_used_ratio,
            disk_usage,
            self.retention_floors,
        )
        self._retention_lock = threading.Lock()
        self._stop = threading.Event()
        self.flusher.start()
        self._housekeeping = threading.Thread(
            target=self._housekeeping_routine, name="store-housekeeping", daemon=True
        )
        self._housekeeping.start()

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Flush everything, write the checkpoint, mark the stop clean, release the lock."""
        if self._closed:
            return
        with self._append_lock:
            self._closed = True
        self._stop.set()
        self._housekeeping.join()
        self.flusher.stop()
        self._checkpoint_now()
        self.consumer_offsets.persist()
        if self.flusher.failure is None:
            cp.mark_clean_close(self.root)
        self.commitlog.close()
        self.queues.close()
        self.compacted.close()
        if self.index is not None:
            self.index.close()
        self._lock_file.release()

    @property
    def healthy(self) -> bool:
        return not self._closed and self.flusher.failure is None

    # -- writing -----------------------------------------------------------------------

    def admit(
        self, messages: Sequence[Message], max_body: int | None = None
    ) -> AdmittedBatch | PutResult:
        """Check and encode a batch (admission.py), outside the lock; a refusal means
        nothing of it may be written. `max_body` lowers the body limit below the store's."""
        limit = self.settings.max_message_bytes
        if max_body is not None:
            limit = min(limit, max_body)
        return admit(messages, self.topics.get, limit, self.commitlog.max_record_bytes())

    def append(self, batch: AdmittedBatch) -> PutResult:
        """Append an admitted batch in one write; does not wait for fsync."""
        with self._append_lock:
            return self._append_locked(batch.records)

    def put(self, messages: Sequence[Message]) -> PutResult:
        """Admit and append a batch and, with SYNC_FLUSH, block until it is durable: the
        write path for tools and tests. The broker's is AsyncAppender, which waits for
        the flush without blocking its event loop."""
        batch = self.admit(messages)
        if isinstance(batch, PutResult):
            return batch
        result = self.append(batch)
        if not result.status.ok or self.settings.flush_mode is FlushMode.ASYNC_FLUSH:
            return result
        end = result.appended[-1].phys_offset + result.appended[-1].size
        durable = self.flusher.wait(end, self.settings.flush_disk_timeout_ms / 1000)
        return after_flush(result, durable)

    def _append_locked(self, prepared: list[rec.PreparedRecord]) -> PutResult:
        """Caller holds `_append_lock`."""
        if self._closed:
            return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, detail="store is closed")
        if self.flusher.failure is not None:
            return PutResult(
                PutStatus.IO_ERROR, detail=f"fsync failed earlier: {self.flusher.failure}"
            )
        ends = self._queue_ends
        pending: dict[tuple[str, int], int] = {}
        queue_offsets = []
        for p in prepared:
            m = p.message
            if m.is_prepared_transaction:
                queue_offsets.append(0)
                continue
            key = (m.topic, m.queue_id)
            offset = pending.get(key)
            if offset is None:
                offset = ends.get(key, 0)
            queue_offsets.append(offset)
            pending[key] = offset + 1
        store_ts = _now_ms()
        start = self.commitlog.write_offset
        try:
            positions, sizes = self.commitlog.append(
                prepared, queue_offsets, store_ts, _batch_runs(prepared)
            )
        except rec.RecordTooLarge as exc:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, detail=str(exc))
        except OSError as exc:
            return self._write_failed_locked(exc)
        if self._disk_full:
            self._disk_full = False
            log.warning("the store's disk has space again; writes resume")
        ends.update(pending)
        if self._dispatched_offset == start:
            try:
                dispatch_appended(
                    self.queues, self.index, prepared, queue_offsets, positions, sizes, store_ts
                )
                self._dispatched_offset = self.commitlog.write_offset
            except OSError as exc:
                log.error(
                    "dispatch failed (%s); consumers see these messages once it catches up", exc
                )
        appended = [
            AppendedMessage(qo, phys, size)
            for qo, phys, size in zip(queue_offsets, positions, sizes, strict=True)
        ]
        return PutResult(PutStatus.PUT_OK, appended, store_ts)

    # -- replication -------------------------------------------------------------------

    @property
    def max_phys_offset(self) -> int:
        """The end of the CommitLog: where the next record goes."""
        return self.commitlog.write_offset

    @property
    def min_phys_offset(self) -> int:
        return self.commitlog.min_offset

    def read_for_replica(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole records of the CommitLog from `offset` for a slave, and the offset after
        them (see CommitLog.read_whole_records)."""
        return self.commitlog.read_whole_records(offset, max_bytes)

    def check_records(self, offset: int, max_bytes: int) -> RecordCheck:
        """Check the stored records from `offset` for damage (CommitLog.check_records)."""
        with self._retention_lock:  # no segment removed under the read
            return self.commitlog.check_records(offset, max_bytes)

    def sound_record(self, phys_offset: int) -> bytes:
        """The bytes of the record at `phys_offset`, checked (for a replica mending its
        copy); CorruptRecord when they fail their checks or no record starts there."""
        with self._retention_lock:
            head = self.commitlog.read(phys_offset, fmt.SIZE_AND_MAGIC.size)
            if head is None:
                raise rec.CorruptRecord(phys_offset, rec.RecordProblem.END_OF_DATA)
            size = fmt.SIZE_AND_MAGIC.unpack(head)[0]
            fits = 0 < size <= self.commitlog.max_record_bytes()
            data = self.commitlog.read(phys_offset, size) if fits else None
        if data is None:
            raise rec.CorruptRecord(phys_offset, rec.RecordProblem.BAD_SIZE)
        _, problem, is_blank = rec.check_at(data, 0, phys_offset)
        if problem is not None or is_blank:
            raise rec.CorruptRecord(phys_offset, problem or rec.RecordProblem.BAD_MAGIC)
        return data

    def heal_record(self, phys_offset: int, record: bytes) -> bool:
        """Write another replica's sound copy over the damaged record at `phys_offset`
        (CommitLog.rewrite_record); False when the stored bytes already equal it."""
        with self._retention_lock, self._append_lock:
            if self._closed:
                raise OSError("store is closed")
            return self.commitlog.rewrite_record(phys_offset, record)

    def append_replica_copy(self, offset: int, data: bytes) -> None:
        """Store bytes of the master's CommitLog at the same offset and dispatch them to
        the consume queues and the index, as the master did. Raises ValueError when they
        do not continue this log and OSError when the write fails (nothing is kept)."""
        self.write_replica_copy(offset, data)
        self.dispatch_copied()

    def write_replica_copy(self, offset: int, data: bytes) -> None:
        """Store bytes of the master's CommitLog at the same offset, not yet dispatched:
        a slave acknowledges them once written and dispatches them afterwards
        (`dispatch_copied`; a promotion and the housekeeping dispatch whatever is left).
        Raises as `append_replica_copy` does."""
        with self._append_lock:
            if self._closed:
                raise OSError("store is closed")
            empty = self.commitlog.files.last is None
            self.commitlog.append_copy(offset, data)
            if empty and self._dispatched_offset < offset:
                self._dispatched_offset = offset  # an empty log began at the master's segment

    def dispatch_copied(self) -> None:
        """Dispatch copied bytes to the consume queues and the index; a failure is logged
        and caught up later."""
        with self._append_lock:
            if self._closed or self._dispatched_offset >= self.commitlog.write_offset:
                return
            try:
                self._dispatch_from_log()
            except OSError as exc:
                log.error("dispatch of replicated records failed (%s); it catches up later", exc)

    def _dispatch_from_log(self) -> None:
        """Dispatch what the CommitLog holds past `_dispatched_offset` and take the ends of
        the queues it reached. Caller holds `_append_lock`."""
        touched = catch_up(self.commitlog, self.queues, self.index, self._dispatched_offset)
        self._dispatched_offset = self.commitlog.write_offset
        for topic, queue_id in touched:
            queue = self.queues.find(topic, queue_id)
            if queue is not None:
                self._queue_ends[topic, queue_id] = queue.max_offset

    def _all_queue_ends(self) -> dict[tuple[str, int], int]:
        return {(q.topic, q.queue_id): q.max_offset for q in self.queues}

    def truncate_log(self, offset: int) -> None:
        """Cut the CommitLog, consume queues and index back to `offset`: what this replica
        wrote past the last epoch it shares with the master."""
        with self._append_lock:
            self.commitlog.truncate(offset)
            report = RecoveryReport(crashed=False, checkpoint=None)
            drop_units_past(self.queues, offset, report)
            if self.index is not None:
                self.index.truncate_above(offset)
            self._dispatched_offset = min(self._dispatched_offset, offset)
            self._queue_ends = self._all_queue_ends()
        self._checkpoint_now()
        log.warning(
            "CommitLog cut back to %d (%d consume-queue units dropped)",
            offset,
            report.stale_units_dropped,
        )

    def _write_failed_locked(self, exc: OSError) -> PutResult:
        """Caller holds `_append_lock`."""
        if exc.errno in DISK_FULL_ERRNOS:
            if not self._disk_full:
                log.error(
                    "the disk of the store in %s is full (%s): writes are refused until "
                    "space is freed",
                    self.root,
                    exc.strerror,
                )
            self._disk_full = True
            return PutResult(PutStatus.DISK_FULL, detail=disk_full_detail("the message", exc))
        log.error("CommitLog write failed: %s", exc)
        return PutResult(PutStatus.IO_ERROR, detail=str(exc))

    # -- reading -----------------------------------------------------------------------

    def delete_topic(self, topic: str) -> bool:
        """Forget a topic: its config, consume queues and committed offsets. Its records
        stay in the CommitLog until retention removes them. (A crash right after may let
        recovery re-dispatch records written since the last checkpoint into the deleted
        topic's queue directories; they stay invisible unless the topic is created again.)"""
        with self._append_lock:
            existed = self.topics.delete(topic)
            self.queues.delete_topic(topic)
            self.compacted.delete_topic(topic)
            for key in [k for k in self._queue_ends if k[0] == topic]:
                del self._queue_ends[key]
        self.consumer_offsets.remove_topic(topic)
        return existed

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int] | None:
        """(min, max) logical offsets of a queue, or None if it does not exist. A compacted
        queue starts at its first kept record."""
        queue = self._queue(topic, queue_id)
        if queue is None:
            return None
        view = self.compacted.view(topic, queue_id)
        low = queue.min_offset if view is None else view.low(queue.min_offset)
        return low, queue.max_offset

    def consume_queue_min(self, topic: str, queue_id: int) -> int:
        """The consume queue's own minimum, whatever a compacted copy holds below it."""
        queue = self._queue(topic, queue_id)
        return 0 if queue is None else queue.min_offset

    def stored_record(self, topic: str, queue_id: int, offset: int) -> bytes | None:
        """The CommitLog bytes of the record a consume queue lists at `offset`, unchecked;
        None for a hole, an offset outside the queue or a record retention removed."""
        queue = self._queue(topic, queue_id)
        if queue is None or not queue.min_offset <= offset < queue.max_offset:
            return None
        unit = queue.unit_at(offset)
        if unit is None or unit.is_hole or unit.phys_offset < self.commitlog.min_offset:
            return None
        data = self.commitlog.read(unit.phys_offset, unit.size)
        if data is None or rec.entry_back(data, 0) is None:
            return data
        try:  # an entry of a batch record: the same message as a record of its own
            message = self.commitlog.read_message(unit.phys_offset)
        except rec.CorruptRecord:
            return data  # unreadable as it is
        return rec.standalone(message) if message is not None else None

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        queue = self.queues.find(topic, queue_id)
        if queue is None:
            config = self.topics.get(topic)
            if config is not None and 0 <= queue_id < config.queue_dir_count:
                return self.queues.get_or_create(topic, queue_id)
        return queue

    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        tags: set[str] | None = None,
        max_bytes: int = DEFAULT_GET_MAX_BYTES,
    ) -> GetResult:
        """Read up to `max_messages` from a queue at `offset`, optionally filtered by tag."""
        queue = self._queue(topic, queue_id)
        if queue is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE, [], 0, 0, 0)
        view = self.compacted.view(topic, queue_id)
        if view is not None:
            low = view.low(queue.min_offset)
            if low <= offset < view.boundary:
                found = self._read_compacted(view, queue, offset, max_messages, tags, max_bytes)
                if found is not None:
                    return found
                offset = view.boundary  # nothing kept from offset on
            if low <= offset < queue.min_offset:
                offset = queue.min_offset  # the watermark took records above the boundary
        else:
            low = queue.min_offset
        high = queue.max_offset
        status = _offset_status(offset, low, high)
        if status is not None:
            nxt = (
                low
                if status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.NO_MESSAGE_IN_QUEUE)
                else min(offset, high)
            )
            return GetResult(status, [], nxt, low, high)
        return self._read_units(queue, offset, max_messages, tags, max_bytes)

    def _read_compacted(
        self,
        view: CompactedQueue,
        queue: ConsumeQueue,
        offset: int,
        max_messages: int,
        tags: set[str] | None,
        max_bytes: int,
    ) -> GetResult | None:
        """Read kept records of a compacted queue from `offset` (below its boundary); None
        when none is kept at or after it."""
        first = view.index_from(offset)
        if first >= view.kept:
            return None
        wanted = {tag_hash(t) for t in tags} if tags else None
        last = min(view.kept, first + max(max_messages, 1) * (4 if wanted else 1)) - 1
        while last > first and view.positions[last] + view.sizes[last] - view.positions[
            first
        ] > max(max_bytes, view.sizes[first]):
            last -= 1
        data = view.record_bytes(first, last)
        base = view.positions[first]
        messages: list[StoredMessage] = []
        unreadable: list[int] = []
        scanned = first
        for i in range(first, last + 1):
            if len(messages) >= max_messages:
                break
            scanned = i
            if wanted is not None and view.tags[i] not in wanted:
                continue
            try:
                msg = rec.decode(data, view.positions[i] - base)
            except rec.CorruptRecord as exc:
                log.error("unreadable compacted record of %s: %s", queue.topic, exc)
                unreadable.append(view.offsets[i])
                continue
            if tags is None or msg.tags in tags:
                messages.append(msg)
        next_offset = view.offsets[scanned] + 1
        if scanned + 1 >= view.kept:
            next_offset = max(next_offset, view.boundary)  # past the last kept record
        status = GetStatus.FOUND if messages else GetStatus.NO_MATCHED_MESSAGE
        low = view.low(queue.min_offset)
        return GetResult(status, messages, next_offset, low, queue.max_offset, unreadable)

    def _read_units(
        self,
        queue: ConsumeQueue,
        offset: int,
        max_messages: int,
        tags: set[str] | None,
        max_bytes: int,
    ) -> GetResult:
        wanted = {tag_hash(t) for t in tags} if tags else None
        units = queue.read_raw(offset, max(max_messages, 1) * (4 if wanted else 1))
        commitlog_min = self.commitlog.min_offset
        limit = self.read_limit
        picked: list[tuple[int, int, int]] = []  # (queue offset, phys, size)
        scanned, removed, total, unreadable = 0, 0, 0, []
        for phys, size, tag in units:
            if len(picked) >= max_messages or (picked and total + size > max_bytes):
                break
            if limit is not None and size and phys + size > limit:
                break  # not confirmed yet: readable once the replicas hold it
            scanned += 1
            if size == 0:  # a hole
                unreadable.append(offset + scanned - 1)
            elif phys < commitlog_min:
                removed += 1
            elif wanted is None or tag in wanted:
                picked.append((offset + scanned - 1, phys, size))
                total += size
        messages = self._read_records(picked, tags, unreadable)
        next_offset = offset + scanned
        if messages:
            status = GetStatus.FOUND
        elif scanned == 0:
            status = GetStatus.OFFSET_OVERFLOW_ONE  # at the confirmed end: like the queue's end
        elif removed:
            status = GetStatus.MESSAGE_WAS_REMOVING
        else:
            status = GetStatus.NO_MATCHED_MESSAGE
        return GetResult(
            status, messages, next_offset, queue.min_offset, queue.max_offset, unreadable
        )

    def _read_records(
        self, picked: list[tuple[int, int, int]], tags: set[str] | None, unreadable: list[int]
    ) -> list[StoredMessage]:
        """Read the picked records, one pread for the lot when they sit close together;
        an entry of a batch record is read with its whole batch (its one CRC checked)."""
        if not picked:
            return []
        first, last = picked[0][1], picked[-1][1] + picked[-1][2]
        span = (
            self.commitlog.read(first, last - first)
            if 0 < last - first <= _COALESCE_READ_BYTES
            else None
        )
        messages = []
        parse = rec.parse_at
        batches: dict[int, dict[int, StoredMessage]] = {}
        wanted = {phys for _, phys, _ in picked}
        for queue_offset, phys, size in picked:
            if span is not None:
                buf, at = span, phys - first
            else:
                buf, at = self.commitlog.read(phys, size) or b"", 0
            back = rec.entry_back(buf, at)
            if back is None:
                got, problem, msg = parse(buf, at, phys)
            else:
                got, problem, msg = self._batch_entry(batches, phys, back, wanted)
            if msg is None or got != size:
                reason = problem.value if problem else "not the record the queue expects"
                log.error("unreadable record at physical offset %d: %s", phys, reason)
                unreadable.append(queue_offset)
                self._report_damage(phys)
            elif tags is None or msg.tags in tags:
                messages.append(msg)
        return messages

    def _batch_entry(
        self,
        batches: dict[int, dict[int, StoredMessage]],
        phys: int,
        back: int,
        wanted: set[int],
    ) -> tuple[int, rec.RecordProblem | None, StoredMessage | None]:
        """The entry at `phys`, from its batch record (read and checked once per read, the
        `wanted` entries decoded)."""
        start = phys - back
        entries = batches.get(start)
        if entries is None:
            try:
                batch = self.commitlog.read_batch(start, phys, wanted=wanted)
            except rec.CorruptRecord as exc:
                return 0, exc.problem, None
            entries = batches[start] = {m.phys_offset: m for m in batch}
        msg = entries.get(phys)
        if msg is None:
            return 0, rec.RecordProblem.BAD_LAYOUT, None
        return msg.size, None, msg

    def read_message(self, phys_offset: int) -> StoredMessage | None:
        """The message at a physical offset; None if absent, CorruptRecord if damaged."""
        if phys_offset < self.commitlog.min_offset or phys_offset >= self.commitlog.write_offset:
            return None
        try:
            return self.commitlog.read_message(phys_offset)
        except rec.CorruptRecord:
            self._report_damage(phys_offset)
            raise

    def _report_damage(self, phys_offset: int) -> None:
        """Tell `damage_seen` of the record holding `phys_offset`: for an entry of a batch,
        the batch record, which is what a replica fetches and mends whole."""
        with self._retention_lock:
            start = self.commitlog.record_holding(phys_offset)
        self.damage_seen(phys_offset if start is None else start)

    def query_by_key(
        self,
        topic: str,
        key: str,
        begin_ms: int = 0,
        end_ms: int | None = None,
        max_results: int = 32,
    ) -> list[StoredMessage]:
        """Messages of `topic` whose KEYS or message id equal `key`, stored in the time range."""
        if self.index is None:
            return []
        end_ms = _now_ms() if end_ms is None else end_ms
        found = []
        for phys in self.index.query(index_key(topic, key), begin_ms, end_ms, max_results * 2):
            try:
                msg = self.read_message(phys)
            except rec.CorruptRecord:
                continue
            if msg is not None and msg.topic == topic and (key in msg.keys or msg.msg_id == key):
                found.append(msg)
                if len(found) >= max_results:
                    break
        return found

    def query_by_msg_id(self, topic: str, msg_id: str) -> StoredMessage | None:
        """By the producer's message id, or by the broker's offset message id."""
        hits = self.query_by_key(topic, msg_id, max_results=1)
        if hits:
            return hits[0]
        phys = phys_offset_of_msg_id(msg_id)
        if phys is None:
            return None
        try:
            msg = self.read_message(phys)
        except rec.CorruptRecord:
            return None
        return msg if msg is not None and msg.topic == topic else None

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int | None:
        """The first logical offset stored at or after `timestamp_ms` (max if none)."""
        queue = self._queue(topic, queue_id)
        if queue is None:
            return None
        low, high = queue.min_offset, queue.max_offset
        while low < high:
            mid = (low + high) // 2
            unit = queue.unit_at(mid)
            stamp = (
                None
                if unit is None or unit.is_hole
                else self.commitlog.read_store_timestamp(unit.phys_offset)
            )
            if stamp is not None and stamp >= timestamp_ms:
                high = mid
            else:
                low = mid + 1
        return low

    # -- housekeeping ------------------------------------------------------------------

    def _housekeeping_routine(self) -> None:
        s = self.settings
        next_clean = time.monotonic() + s.clean_interval_ms / 1000
        failures = RoutineFailures(log, "store housekeeping (dispatch, checkpoint, offsets)")
        while not self._stop.wait(s.checkpoint_interval_ms / 1000):
            try:
                self.dispatch_pending()
                self._checkpoint_now()
                self.consumer_offsets.persist()
                if time.monotonic() >= next_clean:
                    next_clean = time.monotonic() + s.clean_interval_ms / 1000
                    self.run_retention()
            except OSError as exc:
                failures.failed(exc)
            else:
                failures.succeeded()

    def dispatch_pending(self) -> None:
        """Dispatch whatever the CommitLog holds that the queues and index do not yet."""
        with self._append_lock:
            if self._dispatched_offset < self.commitlog.write_offset:
                self._dispatch_from_log()
                log.info("dispatch caught up to %d", self._dispatched_offset)

    def _checkpoint_now(self) -> None:
        """fsync queues and index, then record how far everything is durable."""
        with self._checkpoint_lock:
            with self._append_lock:
                dispatched = self._dispatched_offset
                table = dict(self._queue_ends)
            self.queues.sync()
            if self.index is not None:
                self.index.flush()
            flushed = self.commitlog.flushed_offset
            cp.write_checkpoint(self.root, cp.Checkpoint(flushed, dispatched, dispatched))
            cp.write_queue_table(self.root, table)

    def disk_used_ratio(self) -> float:
        """How full the CommitLog's file system is, as retention measures it."""
        return self.retention.disk_usage(self.commitlog.files.directory)

    def run_retention(self, now_s: float | None = None) -> int:
        """Apply retention once; return how many CommitLog segments were deleted."""
        return self.retention_round(now_s).segments_deleted

    def retention_round(self, now_s: float | None = None) -> RetentionOutcome:
        """Apply retention once (housekeeping and a finished compaction both call it)."""
        with self._retention_lock:
            self.compacted.release_retired()
            return self.retention.run_once(now_s)

    def retention_floors(self) -> Floors:
        """Where compact topics hold retention back (see retention.py)."""
        uncompacted: int | None = None
        live: int | None = None
        for queue in self.queues:
            if queue.max_offset <= queue.min_offset:
                continue
            compact = is_compact(self.topics.get(queue.topic))
            view = self.compacted.view(queue.topic, queue.queue_id) if compact else None
            start = queue.min_offset if view is None else max(view.boundary, queue.min_offset)
            found = queue.next_message_unit(start, queue.max_offset)
            if found is None:
                continue
            phys = found[1].phys_offset
            if compact:
                uncompacted = phys if uncompacted is None else min(uncompacted, phys)
            else:
                live = phys if live is None else min(live, phys)
        if not self.compacted.topics():
            return Floors(uncompacted, None)
        pending = self._dispatched_offset
        return Floors(uncompacted, pending if live is None else min(live, pending))

    @property
    def dispatched_offset(self) -> int:
        return self._dispatched_offset


def _offset_status(offset: int, low: int, high: int) -> GetStatus | None:
    if high == 0 or (high == low and offset == low == 0):
        return GetStatus.NO_MESSAGE_IN_QUEUE
    if offset < low:
        return GetStatus.OFFSET_TOO_SMALL
    if offset == high:
        return GetStatus.OFFSET_OVERFLOW_ONE
    if offset > high:
        return GetStatus.OFFSET_OVERFLOW_BADLY
    return None


def after_flush(result: PutResult, durable: bool | None) -> PutResult:
    """An append's outcome once its flush is known: durable (True), timed out (None) or
    failed (False)."""
    if durable:
        return result
    if durable is None:
        return PutResult(
            PutStatus.FLUSH_DISK_TIMEOUT,
            result.appended,
            result.store_timestamp_ms,
            "fsync too slow",
        )
    return PutResult(PutStatus.IO_ERROR, result.appended, result.store_timestamp_ms, "fsync failed")
