"""The message index: CommitLog offsets by message key (or message id) within a store-time range.

Modelled on RocketMQ's ``IndexFile``: a fixed-size hash table laid out in a memory-mapped file.
Each key hashes (CRC-32 of its UTF-8 bytes) to a slot holding the number of the newest entry
for that slot; every entry links to the previous entry of the same slot, so a lookup walks one
short chain, newest first. Files fill up and roll over; they live in one directory, named by
their creation time (UTC, ``yyyyMMddHHmmssSSS``), so name order is creation order.

The index is a hint, never the truth:

* Different keys can share a hash, so a lookup may return offsets of other keys' messages; the
  caller must compare the key of the message it reads back from the CommitLog.
* An entry stores its store time in whole seconds since its file's first entry, so a lookup
  treats each entry as stored somewhere within that second: it may return entries up to 999 ms
  outside the asked range (never fewer than asked for); a caller that needs exact bounds
  checks the message's store timestamp.
* A file that cannot be read back is set aside as ``<name>.corrupt`` and the owner (the message
  store) re-dispatches from the CommitLog; losing index entries never loses messages.

Thread safety: one lock guards every file. ``flush`` runs ``msync`` outside that lock (so puts
are not stalled behind the disk) but under a second lock that keeps files from being closed
under it; it is meant for a background thread, never an asyncio loop.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from capstan.common.errors import StoreClosedError
from capstan.common.store_settings import IndexSettings

logger = logging.getLogger(__name__)

# File layout (every integer big-endian):
#
#   +------------------+----------------------------------+------------------------------------+
#   | header, 40 bytes | hash slots, 4 bytes x slot count | entries, 20 bytes x entry capacity |
#   +------------------+----------------------------------+------------------------------------+
#
# Header:
#
#   0               8               16              24              32          36          40
#   +---------------+---------------+---------------+---------------+-----------+-----------+
#   | begin_        | end_          | begin_phys    | end_phys      | hash_slot | index     |
#   | timestamp_ms  | timestamp_ms  | _offset       | _offset       | _count    | _count    |
#   |               |               |               |               | _used     |           |
#   | int64         | int64         | int64         | int64         | u32       | u32       |
#   +---------------+---------------+---------------+---------------+-----------+-----------+
#
#   begin_timestamp_ms     store time of the file's first entry: the base of every time_diff_s
#   end_timestamp_ms       latest store time in the file
#   begin/end_phys_offset  smallest / largest CommitLog offset in the file
#   hash_slot_count_used   number of non-empty hash slots
#   index_count            number of entries, numbered 1..index_count (so 0 can mean "none")
_HEADER = struct.Struct(">qqqqII")
HEADER_BYTES = _HEADER.size

# Hash slot: the number of the newest entry whose key hashes here, 0 when empty.
#
#   0        4
#   +--------+
#   | number |
#   | u32    |
#   +--------+
_SLOT = struct.Struct(">I")
SLOT_BYTES = _SLOT.size

# Entry: one indexed message. time_diff_s = (store time - begin_timestamp_ms) // 1000, never
# negative (a store time before the file's begin starts a new file). prev_entry is the number
# of the next older entry of the same slot, 0 at the end of the chain; it is always smaller
# than the entry's own number, which is what lets a lookup stop on a damaged chain.
#
#   0          4                   12            16           20
#   +----------+-------------------+-------------+------------+
#   | key_hash | phys_offset       | time_diff_s | prev_entry |
#   | u32      | int64             | int32       | u32        |
#   +----------+-------------------+-------------+------------+
_ENTRY = struct.Struct(">IqiI")
ENTRY_BYTES = _ENTRY.size

_TIME_DIFF_MAX_S = 0x7FFF_FFFF
_MS_PER_S = 1000
# Entries only know their store time to the second; this is the rest of that second.
_TIME_SLACK_MS = _MS_PER_S - 1

_NAME_PATTERN = re.compile(r"\d{17}")
_NAME_SECONDS_FORMAT = "%Y%m%d%H%M%S"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CORRUPT_SUFFIX = ".corrupt"
_ZERO_CHUNK_BYTES = 1 << 20
_ZEROS = bytes(_ZERO_CHUNK_BYTES)
# Blocks for entries are reserved this far ahead of the newest one (see `_IndexFile.create`).
RESERVE_STEP_BYTES = 4 << 20


def _file_bytes(settings: IndexSettings) -> int:
    """Size of one index file in bytes."""
    return (
        HEADER_BYTES
        + settings.hash_slots_per_file * SLOT_BYTES
        + settings.index_entries_per_file * ENTRY_BYTES
    )


class _CorruptFileError(Exception):
    """An index file's size or header does not add up; it is set aside, never read."""


def key_hash(key: str) -> int:
    """The 32-bit unsigned hash the index files store for ``key``."""
    return zlib.crc32(key.encode())


def _file_name(epoch_ms: int) -> str:
    moment = _EPOCH + timedelta(milliseconds=epoch_ms)
    return moment.strftime(_NAME_SECONDS_FORMAT) + f"{epoch_ms % _MS_PER_S:03d}"


def _name_epoch_ms(name: str) -> int:
    """Inverse of `_file_name`; raises ValueError for a 17-digit name that is not a date."""
    moment = datetime.strptime(name[:14], _NAME_SECONDS_FORMAT).replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1) + int(name[14:])


class _IndexFile:
    """One mapped index file. Not thread-safe: `IndexService` holds its lock around every call."""

    __slots__ = (
        "_capacity",
        "_entry_base",
        "_fd",
        "_mm",
        "_reserved",
        "_size",
        "_slot_count",
        "begin_phys",
        "begin_ts",
        "count",
        "dirty",
        "end_phys",
        "end_ts",
        "path",
        "slots_used",
    )

    def __init__(self, path: Path, fd: int, mm: mmap.mmap, settings: IndexSettings) -> None:
        self.path = path
        self._fd = fd
        self._mm = mm
        self._slot_count = settings.hash_slots_per_file
        self._capacity = settings.index_entries_per_file
        # Where entry 0 would start: numbering begins at 1, so entry n is at base + n * size.
        self._entry_base = HEADER_BYTES + self._slot_count * SLOT_BYTES - ENTRY_BYTES
        self._size = _file_bytes(settings)
        # Bytes from the start of the file whose blocks are known to be allocated.
        self._reserved = 0
        header: tuple[int, int, int, int, int, int] = _HEADER.unpack_from(mm, 0)
        self.begin_ts, self.end_ts, self.begin_phys, self.end_phys = header[:4]
        self.slots_used, self.count = header[4:]
        self.dirty = False

    @classmethod
    def create(cls, path: Path, settings: IndexSettings) -> _IndexFile:
        """A new, empty file: full size, but only its header and hash slots take disk blocks.

        Writes go through mmap, and a write to an unallocated page of a full disk kills the
        process with SIGBUS. So every byte is allocated (posix_fallocate) before it is first
        written: the header and slots here, entries `RESERVE_STEP_BYTES` at a time ahead of
        the newest (`_reserve_entries`); a full disk is then an OSError before any write. The
        rest stays a hole, so a file costs the disk what it holds (a default file is 420 MB,
        20 MB of it header and slots), not its size.
        """
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, _file_bytes(settings))
            mm = mmap.mmap(fd, _file_bytes(settings))
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        index_file = cls(path, fd, mm, settings)
        try:
            index_file._reserve_entries(0)
        except BaseException:
            index_file.delete()
            raise
        return index_file

    @classmethod
    def open(cls, path: Path, settings: IndexSettings) -> _IndexFile:
        """An existing file; raises `_CorruptFileError` if its size or header is inconsistent."""
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size != _file_bytes(settings):
                raise _CorruptFileError(f"{size} bytes, expected {_file_bytes(settings)}")
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        index_file = cls(path, fd, mm, settings)
        problem = index_file._header_problem()
        if problem is not None:
            index_file.close()
            raise _CorruptFileError(problem)
        # What the file holds is allocated already (as are a crash's uncounted entries, if
        # any: they sit within the reservation made before them), so this only learns it.
        index_file._reserved = index_file._entry_end(index_file.count)
        return index_file

    def _entry_end(self, number: int) -> int:
        """The file offset just past entry ``number`` (past the slots for 0)."""
        return self._entry_base + (number + 1) * ENTRY_BYTES

    def _reserve_entries(self, number: int) -> None:
        """Make sure entries up to ``number`` have their blocks, a step ahead when it must
        allocate; raises OSError (ENOSPC on a full disk) and writes nothing if it cannot."""
        needed = self._entry_end(number)
        if needed <= self._reserved:
            return
        target = min(self._size, max(needed, self._reserved + RESERVE_STEP_BYTES))
        os.posix_fallocate(self._fd, self._reserved, target - self._reserved)
        self._reserved = target

    def _header_problem(self) -> str | None:
        if self.count > self._capacity:
            return f"index_count {self.count} exceeds capacity {self._capacity}"
        if self.slots_used > self._slot_count:
            return f"hash_slot_count_used {self.slots_used} exceeds {self._slot_count} slots"
        if self.count and (self.begin_phys > self.end_phys or self.begin_ts > self.end_ts):
            return "begin offset or timestamp lies after the end"
        return None

    def try_append(self, hash_: int, phys_offset: int, timestamp_ms: int) -> bool:
        """Add one entry, or return False if the file is full or cannot express the time."""
        return self.append_batch([(hash_, phys_offset, timestamp_ms)]) == 1

    def append_batch(self, entries: list[tuple[int, int, int]]) -> int:
        """Add entries (hash, phys_offset, timestamp_ms) in order until the file is full or
        one's time cannot be expressed; return how many were added.

        Entries and slots are written first and the header once at the end, so a crash
        in between leaves uncounted entries that `_live_head` steps over.
        """
        mm, slot_count, base = self._mm, self._slot_count, self._entry_base
        count, capacity = self.count, self._capacity
        self._reserve_entries(min(capacity, count + len(entries)))
        begin_ts = self.begin_ts if count else (entries[0][2] if entries else 0)
        new_slots, added = 0, 0
        low_phys, high_phys, high_ts = self.begin_phys, self.end_phys, self.end_ts
        if not count and entries:
            low_phys = high_phys = entries[0][1]
            high_ts = entries[0][2]
        for hash_, phys_offset, timestamp_ms in entries:
            diff_s = (timestamp_ms - begin_ts) // _MS_PER_S
            if count >= capacity or not 0 <= diff_s <= _TIME_DIFF_MAX_S:
                break
            slot_pos = HEADER_BYTES + hash_ % slot_count * SLOT_BYTES
            head = _SLOT.unpack_from(mm, slot_pos)[0]
            if head > count:
                head = self._live_head(head, count)
            count += 1
            _ENTRY.pack_into(mm, base + count * ENTRY_BYTES, hash_, phys_offset, diff_s, head)
            _SLOT.pack_into(mm, slot_pos, count)
            new_slots += head == 0
            low_phys = min(low_phys, phys_offset)
            high_phys = max(high_phys, phys_offset)
            high_ts = max(high_ts, timestamp_ms)
            added += 1
        if added:
            if not self.count:
                self.begin_ts = begin_ts
            self.begin_phys, self.end_phys, self.end_ts = low_phys, high_phys, high_ts
            self.slots_used += new_slots
            self.count = count
            self.dirty = True
            self._write_header()
        return added

    def _write_header(self) -> None:
        _HEADER.pack_into(
            self._mm,
            0,
            self.begin_ts,
            self.end_ts,
            self.begin_phys,
            self.end_phys,
            self.slots_used,
            self.count,
        )

    def _live_head(self, number: int, count: int | None = None) -> int:
        """The newest counted entry of a chain that starts at ``number``.

        A crash between writing an entry (and its slot) and the header leaves the slot pointing
        one past ``count``; that entry is intact and its ``prev_entry`` leads back to counted ones.
        """
        count = self.count if count is None else count
        while number > count:
            if number > self._capacity:
                return 0
            prev = _ENTRY.unpack_from(self._mm, self._entry_base + number * ENTRY_BYTES)[3]
            number = prev if prev < number else 0
        return number

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        """Whether any entry of this file can lie in [begin_ms, end_ms] (to the second)."""
        return (
            self.count > 0 and self.begin_ts <= end_ms and self.end_ts + _TIME_SLACK_MS >= begin_ms
        )

    def collect(
        self, hash_: int, begin_ms: int, end_ms: int, limit: int, found: list[int], seen: set[int]
    ) -> None:
        """Append to ``found`` (newest first) the offsets in range whose hash is ``hash_``."""
        mm, base = self._mm, self._entry_base
        slot_pos = HEADER_BYTES + hash_ % self._slot_count * SLOT_BYTES
        number = self._live_head(_SLOT.unpack_from(mm, slot_pos)[0])
        while number and len(found) < limit:
            entry_hash, phys, diff_s, prev = _ENTRY.unpack_from(mm, base + number * ENTRY_BYTES)
            stored_ms = self.begin_ts + diff_s * _MS_PER_S
            in_range = stored_ms <= end_ms and stored_ms + _TIME_SLACK_MS >= begin_ms
            if entry_hash == hash_ and in_range and phys not in seen:
                found.append(phys)
                seen.add(phys)
            number = prev if prev < number else 0

    def compact_below(self, limit: int) -> int:
        """Drop entries with phys_offset >= limit; returns how many were dropped.

        Kept entries move down to numbers 1..kept in their original order and every chain is
        rebuilt from scratch, so the file reads as if the dropped entries were never put. The
        begin timestamp (base of every time_diff_s) and the end timestamp stay as they were.
        O(entries); only crash recovery calls it. Needs at least one kept entry.
        """
        old_count = self.count
        self._zero_slots()
        self.count = self.slots_used = 0
        self.begin_phys, self.end_phys = limit, -1
        mm, base = self._mm, self._entry_base
        for number in range(1, old_count + 1):
            hash_, phys, diff_s, _ = _ENTRY.unpack_from(mm, base + number * ENTRY_BYTES)
            if phys < limit:
                self._relink(hash_, phys, diff_s)
        self.dirty = True
        self._write_header()
        return old_count - self.count

    def _relink(self, hash_: int, phys_offset: int, diff_s: int) -> None:
        """Write an entry as number count + 1 at the head of its slot's chain (compaction)."""
        slot_pos = HEADER_BYTES + hash_ % self._slot_count * SLOT_BYTES
        head = _SLOT.unpack_from(self._mm, slot_pos)[0]
        self.count += 1
        if head == 0:
            self.slots_used += 1
        _ENTRY.pack_into(
            self._mm, self._entry_base + self.count * ENTRY_BYTES, hash_, phys_offset, diff_s, head
        )
        _SLOT.pack_into(self._mm, slot_pos, self.count)
        self.begin_phys = min(self.begin_phys, phys_offset)
        self.end_phys = max(self.end_phys, phys_offset)

    def _zero_slots(self) -> None:
        end = self._entry_base + ENTRY_BYTES
        for start in range(HEADER_BYTES, end, _ZERO_CHUNK_BYTES):
            stop = min(end, start + _ZERO_CHUNK_BYTES)
            self._mm[start:stop] = _ZEROS[: stop - start]

    def flush(self) -> None:
        # fsync, not mmap.flush(): msync through the mmap module holds the GIL for the
        # whole call and so stalls every other thread of the broker; fsync releases it,
        # and on Linux it writes back the shared mapping's dirty pages just the same.
        os.fsync(self._fd)

    def close(self) -> None:
        self._mm.close()
        os.close(self._fd)

    def delete(self) -> None:
        self.close()
        self.path.unlink()


def _is_index_name(name: str) -> bool:
    if not _NAME_PATTERN.fullmatch(name):
        return False
    try:
        _name_epoch_ms(name)
    except ValueError:
        logger.warning("ignoring %s in the index directory: 17 digits but not a time", name)
        return False
    return True


def _open_existing(directory: Path, settings: IndexSettings) -> list[_IndexFile]:
    """Open the directory's index files in name order, setting aside the ones that don't add up."""
    files: list[_IndexFile] = []
    for path in sorted(directory.iterdir()):
        if not _is_index_name(path.name):
            continue
        try:
            files.append(_IndexFile.open(path, settings))
        except _CorruptFileError as error:
            aside = path.with_name(path.name + _CORRUPT_SUFFIX)
            logger.warning("index file %s is corrupt (%s); moved to %s", path, error, aside.name)
            path.replace(aside)
    return files


class IndexService:
    """Every index file of one store: put entries, look keys up, truncate and retire files."""

    def __init__(self, directory: Path, settings: IndexSettings) -> None:
        self._directory = directory
        self._settings = settings
        # Guards _files, _closed and the contents of every file.
        self._lock = threading.Lock()
        # Held across msync so no file is closed under it; always taken before _lock.
        self._flush_lock = threading.Lock()
        self._closed = False
        directory.mkdir(parents=True, exist_ok=True)
        self._files = _open_existing(directory, settings)

    @property
    def file_count(self) -> int:
        with self._lock:
            return len(self._files)

    @property
    def max_phys_offset(self) -> int:
        """The largest CommitLog offset indexed (0 if none); recovery re-dispatches above it."""
        with self._lock:
            return max((f.end_phys for f in self._files if f.count), default=0)

    def put(self, key: str, phys_offset: int, store_timestamp_ms: int) -> None:
        """Index the message at ``phys_offset`` under ``key`` (a message key or a message id)."""
        hash_ = zlib.crc32(key.encode())
        with self._lock:
            self._put_locked(hash_, phys_offset, store_timestamp_ms)

    def put_many(self, entries: Iterable[tuple[str, int, int]]) -> None:
        """`put` for each (key, phys_offset, store_timestamp_ms), under one lock acquisition."""
        crc = zlib.crc32
        batch = [(crc(key.encode()), phys, ts) for key, phys, ts in entries]
        with self._lock:
            if self._closed:
                raise StoreClosedError("the index service is closed")
            while batch:
                files = self._files
                added = files[-1].append_batch(batch) if files else 0
                if not added:
                    # An empty file takes any entry, so this always makes progress.
                    added = self._roll_locked().append_batch(batch)
                batch = batch[added:]

    def _put_locked(self, hash_: int, phys_offset: int, timestamp_ms: int) -> None:
        if self._closed:
            raise StoreClosedError("the index service is closed")
        files = self._files
        if not (files and files[-1].try_append(hash_, phys_offset, timestamp_ms)):
            # An empty file takes any entry, so this cannot fail.
            self._roll_locked().try_append(hash_, phys_offset, timestamp_ms)

    def _roll_locked(self) -> _IndexFile:
        """Start a new file, named after now but always after the newest file (clocks step back)."""
        epoch_ms = time.time_ns() // 1_000_000
        if self._files:
            epoch_ms = max(epoch_ms, _name_epoch_ms(self._files[-1].path.name) + 1)
        index_file = _IndexFile.create(self._directory / _file_name(epoch_ms), self._settings)
        self._files.append(index_file)
        return index_file

    def query(self, key: str, begin_ms: int, end_ms: int, max_results: int) -> list[int]:
        """CommitLog offsets indexed under ``key``'s hash with store time in [begin_ms, end_ms].

        Most recently put first (descending offset when puts follow the CommitLog), without
        duplicates, at most ``max_results``. Only a hint: other keys with the same CRC-32 are
        included and times are known to the second (see the module docstring), so the caller
        must check each message's key (and exact store time if it matters) after reading it.
        """
        hash_ = key_hash(key)
        found: list[int] = []
        seen: set[int] = set()
        with self._lock:
            self._check_open_locked()
            if begin_ms > end_ms:
                return found
            for index_file in reversed(self._files):
                if len(found) >= max_results:
                    break
                if index_file.overlaps(begin_ms, end_ms):
                    index_file.collect(hash_, begin_ms, end_ms, max_results, found, seen)
        return found

    def truncate_above(self, phys_offset: int) -> int:
        """Forget entries with phys_offset >= ``phys_offset``; returns how many were dropped.

        For after crash recovery cut the CommitLog's tail. A file whose smallest offset is at or
        above the cut is deleted; a file straddling it is compacted in place (`compact_below`),
        so later puts, with offsets above the cut again, append to clean chains. A crash during
        compaction can lose that file's entries, which recovery's re-dispatch puts back only
        above `max_phys_offset`: acceptable for an index that is a hint.
        """
        with self._flush_lock, self._lock:
            self._check_open_locked()
            dropped = 0
            doomed: list[_IndexFile] = []
            for index_file in self._files:
                if index_file.count == 0 or index_file.end_phys < phys_offset:
                    continue
                if index_file.begin_phys >= phys_offset:
                    dropped += index_file.count
                    doomed.append(index_file)
                else:
                    dropped += index_file.compact_below(phys_offset)
            self._remove_locked(doomed)
            return dropped

    def delete_files_below(self, phys_offset: int) -> int:
        """Delete files, except the newest, whose entries all lie below ``phys_offset``.

        For when retention raised the CommitLog's minimum offset. Returns how many were deleted.
        """
        with self._flush_lock, self._lock:
            self._check_open_locked()
            doomed = [f for f in self._files[:-1] if f.count == 0 or f.end_phys < phys_offset]
            self._remove_locked(doomed)
            return len(doomed)

    def _remove_locked(self, doomed: list[_IndexFile]) -> None:
        for index_file in doomed:
            self._files.remove(index_file)
            index_file.delete()
            logger.info("deleted index file %s", index_file.path.name)

    def flush(self) -> None:
        """msync the files written since the last flush; blocking, so call it from a thread."""
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    return
                dirty = [f for f in self._files if f.dirty]
                for index_file in dirty:
                    index_file.dirty = False
            for index_file in dirty:
                index_file.flush()

    def close(self) -> None:
        """Flush and unmap every file; later calls other than `close` and `flush` raise."""
        with self._flush_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            for index_file in self._files:
                index_file.flush()
                index_file.close()
            self._files = []

    def _check_open_locked(self) -> None:
        if self._closed:
            raise StoreClosedError("the index service is closed")
