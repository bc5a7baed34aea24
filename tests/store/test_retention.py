"""Retention: CommitLog segments go by age and by disk usage; queues, index and readers follow."""

from __future__ import annotations

import os
import pathlib
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from capstan.broker.store.message import StoredMessage
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.retention import disk_used_ratio, used_ratio
from capstan.broker.store.status import GetStatus, PutStatus
from capstan.broker.store.topic_config import TopicConfig

from .conftest import TOPIC, make_message, small_settings

RESERVED_HOURS = 72.0  # StoreSettings' default file_reserved_hours
AFTER_EXPIRY = RESERVED_HOURS * 3600 + 10
CQ_FILE_BYTES = 64 * 20  # consume_queue_units_per_segment=64 in small_settings, 20-byte units


def roomy_disk(path: pathlib.Path) -> float:
    """A disk far below the 0.75 watermark, whatever the machine running the tests looks like."""
    return 0.10


def open_with_disk(
    root: pathlib.Path, disk_usage: Callable[[pathlib.Path], float], **overrides: object
) -> MessageStore:
    store = MessageStore(root, small_settings(**overrides), disk_usage=disk_usage)
    if store.topics.get(TOPIC) is None:
        store.topics.put(TopicConfig(TOPIC, 4, 4))
    return store


@dataclass(frozen=True)
class Sent:
    i: int
    queue_id: int
    queue_offset: int
    phys_offset: int


def put_one(store: MessageStore, i: int, queue_id: int) -> Sent:
    result = store.put([make_message(i, queue_id=queue_id)])
    assert result.status is PutStatus.PUT_OK, result
    [a] = result.appended
    return Sent(i, queue_id, a.queue_offset, a.phys_offset)


def fill(store: MessageStore, count: int, start: int = 0) -> list[Sent]:
    """`count` ~1.2 KiB messages round-robin over queues 0-3 (about 54 per 64 KiB segment)."""
    return [put_one(store, i, i % 4) for i in range(start, start + count)]


def bounds(store: MessageStore, queue_id: int) -> tuple[int, int]:
    found = store.queue_bounds(TOPIC, queue_id)
    assert found is not None
    return found


def segment_starts(store: MessageStore) -> list[int]:
    return [s.start for s in store.commitlog.files.segments]


def files_in(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def names(starts: list[int]) -> list[str]:
    return [f"{s:020d}" for s in starts]


def read_queue(store: MessageStore, queue_id: int, offset: int) -> list[StoredMessage]:
    """Everything from `offset` to the end of a queue; every read on the way must be FOUND."""
    messages: list[StoredMessage] = []
    while True:
        got = store.get(TOPIC, queue_id, offset, max_messages=32)
        if got.status is GetStatus.OFFSET_OVERFLOW_ONE:
            return messages
        assert got.status is GetStatus.FOUND, (queue_id, offset, got.status)
        assert got.unreadable_offsets == []
        messages += got.messages
        offset = got.next_begin_offset


def expected_from(sent: list[Sent], queue_id: int, low: int) -> list[tuple[int, bytes]]:
    return [
        (m.queue_offset, make_message(m.i).body)
        for m in sent
        if m.queue_id == queue_id and m.queue_offset >= low
    ]


def first_kept_offsets(sent: list[Sent], log_min: int) -> dict[int, int]:
    """Per queue, the first queue offset whose message lies at or above the log's minimum."""
    return {
        q: min(m.queue_offset for m in sent if m.queue_id == q and m.phys_offset >= log_min)
        for q in range(4)
    }


def test_expired_segments_go_except_the_last_two_and_readers_follow(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "store"
    with open_with_disk(root, roomy_disk) as store:
        sent = fill(store, 400)
        starts = segment_starts(store)
        assert len(starts) >= 6
        index_files = len(files_in(root / "index"))

        deleted = store.run_retention(now_s=time.time() + AFTER_EXPIRY)

        assert deleted == len(starts) - 2
        assert files_in(root / "commitlog") == names(starts[-2:])
        log_min = store.commitlog.min_offset
        assert log_min == starts[-2]
        gone = [m for m in sent if m.phys_offset < log_min]
        kept = [m for m in sent if m.phys_offset >= log_min]
        assert gone and kept
        low = first_kept_offsets(sent, log_min)
        for q in range(4):
            assert bounds(store, q) == (low[q], 100)
            below = store.get(TOPIC, q, low[q] - 1)
            assert (below.status, below.messages) == (GetStatus.OFFSET_TOO_SMALL, [])
            assert below.next_begin_offset == low[q]
            assert store.get(TOPIC, q, 0).status is GetStatus.OFFSET_TOO_SMALL
            got = read_queue(store, q, low[q])
            assert [(m.queue_offset, m.body) for m in got] == expected_from(sent, q, low[q])
            assert all(m.phys_offset >= log_min for m in got)
            # consume-queue files made only of removed units are deleted too
            cq_dir = root / "consumequeue" / TOPIC / str(q)
            first_file = low[q] * 20 - low[q] * 20 % CQ_FILE_BYTES
            assert files_in(cq_dir) == names(list(range(first_file, 100 * 20, CQ_FILE_BYTES)))
        assert len(files_in(root / "index")) < index_files

        for m in (gone[0], gone[-1]):
            assert store.query_by_key(TOPIC, f"key-{m.i}") == []
            assert store.query_by_msg_id(TOPIC, f"ID{m.i:020d}") is None
            assert store.read_message(m.phys_offset) is None
        for m in (kept[0], kept[-1]):
            [hit] = store.query_by_key(TOPIC, f"key-{m.i}")
            assert (hit.body, hit.phys_offset) == (make_message(m.i).body, m.phys_offset)


def test_young_segments_on_a_roomy_disk_are_kept(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    with open_with_disk(root, roomy_disk) as store:
        sent = fill(store, 300)
        before = files_in(root / "commitlog")
        assert len(before) >= 5

        assert store.run_retention(now_s=time.time()) == 0
        assert store.run_retention() == 0
        assert store.run_retention(now_s=time.time() + RESERVED_HOURS * 3600 - 60) == 0

        assert files_in(root / "commitlog") == before
        assert store.commitlog.min_offset == 0
        for q in range(4):
            assert bounds(store, q) == (0, 75)
        first = store.get(TOPIC, 0, 0, max_messages=1)
        assert first.status is GetStatus.FOUND
        assert first.messages[0].body == make_message(0).body
        [hit] = store.query_by_key(TOPIC, f"key-{sent[0].i}")
        assert hit.phys_offset == 0


def test_only_segments_older_than_the_reserved_hours_go(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    with open_with_disk(root, roomy_disk, file_reserved_hours=0.5) as store:
        sent = fill(store, 400)
        starts = segment_starts(store)
        long_ago = time.time() - 0.5 * 3600 - 60
        for name in names(starts[:2]):
            os.utime(root / "commitlog" / name, (long_ago, long_ago))

        assert store.run_retention(now_s=time.time()) == 2

        assert files_in(root / "commitlog") == names(starts[2:])
        assert store.commitlog.min_offset == starts[2]
        low = first_kept_offsets(sent, starts[2])
        for q in range(4):
            assert bounds(store, q) == (low[q], 100)
            got = read_queue(store, q, low[q])
            assert [(m.queue_offset, m.body) for m in got] == expected_from(sent, q, low[q])


def test_a_nearly_full_disk_deletes_young_segments_oldest_first_keeping_two(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "store"
    asked: list[pathlib.Path] = []

    def nearly_full(path: pathlib.Path) -> float:
        asked.append(pathlib.Path(path))
        return 0.95

    with open_with_disk(root, nearly_full) as store:
        sent = fill(store, 300)
        starts = segment_starts(store)
        assert len(starts) >= 5

        assert store.run_retention(now_s=time.time()) == len(starts) - 2

        assert files_in(root / "commitlog") == names(starts[-2:])
        assert asked and all(p.is_relative_to(root) for p in asked)
        log_min = store.commitlog.min_offset
        assert log_min == starts[-2]
        low = first_kept_offsets(sent, log_min)
        for q in range(4):
            assert bounds(store, q) == (low[q], 75)
            too_small = store.get(TOPIC, q, 0)
            assert too_small.status is GetStatus.OFFSET_TOO_SMALL
            assert too_small.next_begin_offset == low[q]
            got = read_queue(store, q, low[q])
            assert [(m.queue_offset, m.body) for m in got] == expected_from(sent, q, low[q])
        # the two newest segments are never deleted, however full the disk
        assert store.run_retention(now_s=time.time()) == 0
        assert files_in(root / "commitlog") == names(starts[-2:])


class CommitLogOnlyDisk:
    """A disk that holds nothing but the CommitLog: usage is its files' bytes over a capacity."""

    def __init__(self) -> None:
        self.capacity: float | None = None

    def __call__(self, path: pathlib.Path) -> float:
        if self.capacity is None:
            return 0.0
        return sum(p.stat().st_size for p in pathlib.Path(path).iterdir()) / self.capacity


def test_deleting_under_disk_pressure_stops_once_usage_is_under_the_ratio(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "store"
    disk = CommitLogOnlyDisk()
    with open_with_disk(root, disk) as store:
        sent = fill(store, 300)
        starts = segment_starts(store)
        assert len(starts) >= 5
        used = sum(p.stat().st_size for p in (root / "commitlog").iterdir())
        disk.capacity = used / 0.80  # 80% full; one segment less is under 75%

        assert store.run_retention(now_s=time.time()) == 1

        assert files_in(root / "commitlog") == names(starts[1:])
        assert store.commitlog.min_offset == starts[1]
        low = first_kept_offsets(sent, starts[1])
        for q in range(4):
            assert bounds(store, q) == (low[q], 75)
            got = store.get(TOPIC, q, low[q], max_messages=1)
            assert got.status is GetStatus.FOUND
            assert got.messages[0].body == make_message(low[q] * 4 + q).body
        assert store.run_retention(now_s=time.time()) == 0
        assert files_in(root / "commitlog") == names(starts[1:])


def test_reopen_after_retention_keeps_the_log_and_its_reads(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    with open_with_disk(root, roomy_disk) as store:
        sent = fill(store, 400)
        store.run_retention(now_s=time.time() + AFTER_EXPIRY)
        log_min = store.commitlog.min_offset
        before = {q: bounds(store, q) for q in range(4)}
        kept_files = files_in(root / "commitlog")
    gone = [m for m in sent if m.phys_offset < log_min]
    kept = [m for m in sent if m.phys_offset >= log_min]

    with open_with_disk(root, roomy_disk) as store:
        assert not store.recovery.crashed and store.recovery.lost_nothing
        assert files_in(root / "commitlog") == kept_files
        assert store.commitlog.min_offset == log_min
        for q in range(4):
            low, high = before[q]
            assert bounds(store, q)[1] == high
            got = read_queue(store, q, low)
            assert [(m.queue_offset, m.body) for m in got] == expected_from(sent, q, low)
        assert store.query_by_key(TOPIC, f"key-{gone[-1].i}") == []
        [hit] = store.query_by_key(TOPIC, f"key-{kept[0].i}")
        assert hit.body == make_message(kept[0].i).body
        assert put_one(store, 1000, 1).queue_offset == 100


def test_reopen_after_retention_keeps_queue_minimums(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    with open_with_disk(root, roomy_disk) as store:
        for i in range(8):
            put_one(store, i, 3)  # queue 3 only ever holds messages that retention deletes
        for i in range(8, 400):
            put_one(store, i, i % 3)
        store.run_retention(now_s=time.time() + AFTER_EXPIRY)
        before = {q: bounds(store, q) for q in range(4)}
        assert before[3] == (8, 8)

    with open_with_disk(root, roomy_disk) as store:
        assert {q: bounds(store, q) for q in range(4)} == before
        for q in range(4):
            low = before[q][0]
            below = store.get(TOPIC, q, low - 1)
            assert below.status is GetStatus.OFFSET_TOO_SMALL
            assert below.next_begin_offset == low


def test_a_queue_lost_after_retention_is_rebuilt_with_its_offsets(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    with open_with_disk(root, roomy_disk) as store:
        sent = fill(store, 400)
        store.run_retention(now_s=time.time() + AFTER_EXPIRY)
        before = {q: bounds(store, q) for q in range(4)}
    for path in (root / "consumequeue" / TOPIC / "2").iterdir():
        path.unlink()

    with open_with_disk(root, roomy_disk) as store:
        assert {q: bounds(store, q) for q in range(4)} == before
        low = before[2][0]
        below = store.get(TOPIC, 2, 0)
        assert (below.status, below.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, low)
        got = read_queue(store, 2, low)
        assert [(m.queue_offset, m.body) for m in got] == expected_from(sent, 2, low)
        assert put_one(store, 1000, 2).queue_offset == 100


def test_writes_after_retention_continue_queue_offsets(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    with open_with_disk(root, roomy_disk) as store:
        sent = [put_one(store, i, 3) for i in range(8)]  # queue 3 is emptied by retention
        sent += [put_one(store, i, i % 3) for i in range(8, 300)]
        store.run_retention(now_s=time.time() + AFTER_EXPIRY)
        assert bounds(store, 3) == (8, 8)
        emptied = store.get(TOPIC, 3, 0)
        assert (emptied.status, emptied.next_begin_offset) == (GetStatus.OFFSET_TOO_SMALL, 8)
        assert store.get(TOPIC, 3, 8).status is GetStatus.OFFSET_OVERFLOW_ONE
        ends = {q: bounds(store, q)[1] for q in range(4)}

        later = [put_one(store, i, i % 4) for i in range(300, 500)]

        for q in range(4):
            offsets = [m.queue_offset for m in later if m.queue_id == q]
            assert offsets == list(range(ends[q], ends[q] + len(offsets)))
        sent += later
        # a second round over the grown log still leaves every queue readable and dense
        assert store.run_retention(now_s=time.time() + AFTER_EXPIRY) > 0
        log_min = store.commitlog.min_offset
        low = first_kept_offsets(sent, log_min)
        for q in range(4):
            high = ends[q] + sum(1 for m in later if m.queue_id == q)
            assert bounds(store, q) == (low[q], high)
            got = read_queue(store, q, low[q])
            assert [(m.queue_offset, m.body) for m in got] == expected_from(sent, q, low[q])
        assert len(files_in(root / "commitlog")) == 2

    with open_with_disk(root, roomy_disk) as store:
        nxt = put_one(store, 999, 3)
        assert nxt.queue_offset == ends[3] + sum(1 for m in later if m.queue_id == 3)
        got = store.get(TOPIC, 3, nxt.queue_offset)
        assert [m.body for m in got.messages] == [make_message(999).body]


def test_a_hole_in_a_queue_does_not_hide_kept_messages_from_retention(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "store"
    with open_with_disk(root, roomy_disk) as store:
        sent = [put_one(store, i, 0) for i in range(300)]
        starts = segment_starts(store)
    kept_from = starts[-2]
    first_kept = min(m.queue_offset for m in sent if m.phys_offset >= kept_from)
    # the first unit of the kept range that a bisection over the queue looks at
    low, high = 0, len(sent)
    while sent[(low + high) // 2].phys_offset < kept_from:
        low = (low + high) // 2 + 1
    probe = (low + high) // 2
    assert probe > first_kept
    # wreck that record and lose the queue: recovery rebuilds it with a hole at `probe`
    with open(root / "commitlog" / f"{kept_from:020d}", "r+b") as f:
        f.seek(sent[probe].phys_offset - kept_from)
        f.write(b"\xde\xad\xbe\xef" * 2)
    for path in (root / "consumequeue" / TOPIC / "0").iterdir():
        path.unlink()

    with open_with_disk(root, roomy_disk) as store:
        assert store.recovery.hole_units == 1
        assert store.run_retention(now_s=time.time() + AFTER_EXPIRY) == len(starts) - 2

        assert bounds(store, 0) == (first_kept, 300)
        bodies, unreadable, offset = [], [], first_kept
        while (got := store.get(TOPIC, 0, offset)).status is GetStatus.FOUND:
            bodies += [m.body for m in got.messages]
            unreadable += got.unreadable_offsets
            offset = got.next_begin_offset
        assert got.status is GetStatus.OFFSET_OVERFLOW_ONE
        assert unreadable == [probe]
        assert bodies == [make_message(i).body for i in range(first_kept, 300) if i != probe]


def figures(blocks: int, free: int, available: int) -> os.statvfs_result:
    """statvfs figures of a 4 KiB-block filesystem; `free - available` blocks are reserved."""
    return os.statvfs_result((4096, 4096, blocks, free, available, 1000, 500, 500, 0, 255))


# 1,000 blocks: 300 used, 700 free of which 500 are reserved for root, 200 available.
# `df` shows 300 / (300 + 200) = 60 %; counting the reserve as used would say 80 %.
RESERVE_HEAVY = figures(blocks=1000, free=700, available=200)


def test_the_used_ratio_is_what_df_shows_not_counting_the_reserve() -> None:
    assert used_ratio(RESERVE_HEAVY) == 0.6
    assert used_ratio(figures(blocks=1000, free=1000, available=950)) == 0.0
    assert used_ratio(figures(blocks=1000, free=50, available=0)) == 1.0
    assert used_ratio(figures(blocks=0, free=0, available=0)) == 0.0


def test_this_machines_store_disk_reads_as_df_says(tmp_path: pathlib.Path) -> None:
    shown = subprocess.run(
        ["df", "--output=pcent", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    # df rounds its percentage up; the two reads may also see a few blocks change.
    assert abs(disk_used_ratio(tmp_path) * 100 - int(shown.rstrip("%"))) <= 1.5


def test_a_disk_with_a_large_reserve_below_the_watermark_keeps_its_segments(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "store"
    reading = [RESERVE_HEAVY]

    def disk(path: pathlib.Path) -> float:
        return disk_used_ratio(path, statvfs=lambda _: reading[0])

    with open_with_disk(root, disk) as store:
        fill(store, 300)
        before = files_in(root / "commitlog")
        assert len(before) >= 5

        assert store.run_retention(now_s=time.time()) == 0
        assert files_in(root / "commitlog") == before
        for q in range(4):
            assert bounds(store, q) == (0, 75)

        # The same reserve, but what is left available is nearly gone: 900 / (900 + 50).
        reading[0] = figures(blocks=1500, free=550, available=50)
        assert store.run_retention(now_s=time.time()) == len(before) - 2
