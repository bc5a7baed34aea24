"""Recovery outcomes after crashes and damaged files, asserted exactly."""

from __future__ import annotations

import os
import pathlib

from capstan.broker.store import format as fmt
from capstan.broker.store.checkpoint import CHECKPOINT_FILE
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.status import GetStatus

from .conftest import TOPIC, make_message, open_store, write_then_crash


def read_queue(store: MessageStore, queue_id: int) -> list[bytes]:
    bodies, offset = [], 0
    while True:
        got = store.get(TOPIC, queue_id, offset, 32)
        if got.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
            return bodies
        bodies += [m.body for m in got.messages]
        offset = got.next_begin_offset


def assert_all_present(
    store: MessageStore, acked: list[tuple[int, int, int, int, int]], queues: int = 4
) -> None:
    for q in range(queues):
        expected = [make_message(i).body for i, queue, *_ in acked if queue == q]
        assert read_queue(store, q) == expected


def last_segment(root: pathlib.Path) -> pathlib.Path:
    return sorted((root / "commitlog").iterdir())[-1]


def test_crash_is_told_from_a_clean_stop(tmp_path: pathlib.Path) -> None:
    acked = write_then_crash(tmp_path, 12)
    with open_store(tmp_path) as s:
        assert s.recovery.crashed and s.recovery.lost_nothing
        assert_all_present(s, acked)
    with open_store(tmp_path) as s:
        assert not s.recovery.crashed


def test_torn_tail_after_last_record_is_cut_exactly(tmp_path: pathlib.Path) -> None:
    acked = write_then_crash(tmp_path, 20)
    segment = last_segment(tmp_path)
    end = segment.stat().st_size
    data = segment.read_bytes()
    last_phys, last_size = acked[-1][3], acked[-1][4]
    start_in_segment = last_phys - int(segment.name)
    with open(segment, "ab") as f:  # a half-written copy of a record: a torn append
        f.write(data[start_in_segment : start_in_segment + 300])
    with open_store(tmp_path) as s:
        r = s.recovery
        assert r.truncated_at == int(segment.name) + end and r.truncated_bytes == 300
        assert r.damaged_ranges == []
        assert segment.stat().st_size == end
        assert_all_present(s, acked)
        nxt = s.put([make_message(99, queue_id=0)]).appended[0]
        assert nxt.phys_offset == int(segment.name) + end
        assert nxt.queue_offset == 5
    assert last_size > 300


def test_torn_last_record_is_dropped_with_its_queue_unit(tmp_path: pathlib.Path) -> None:
    acked = write_then_crash(tmp_path, 20)
    segment = last_segment(tmp_path)
    os.truncate(segment, segment.stat().st_size - 100)
    last_phys, last_size = acked[-1][3], acked[-1][4]
    with open_store(tmp_path) as s:
        r = s.recovery
        assert r.truncated_at == last_phys and r.truncated_bytes == last_size - 100
        assert r.stale_units_dropped == 1
        assert_all_present(s, acked[:-1])
        assert s.queue_bounds(TOPIC, acked[-1][1]) == (0, acked[-1][2])


def test_zeroed_tail_is_cut(tmp_path: pathlib.Path) -> None:
    acked = write_then_crash(tmp_path, 10)
    segment = last_segment(tmp_path)
    with open(segment, "ab") as f:
        f.write(bytes(4096))
    with open_store(tmp_path) as s:
        assert s.recovery.truncated_bytes == 4096
        assert_all_present(s, acked)


def test_flipped_body_byte_makes_one_message_unreadable(tmp_path: pathlib.Path) -> None:
    with open_store(tmp_path) as s:
        appended = [s.put([make_message(i)]).appended[0] for i in range(10)]
    victim = appended[5]
    segment = last_segment(tmp_path)
    with open(segment, "r+b") as f:
        f.seek(victim.phys_offset + fmt.RECORD_HEADER_BYTES + 40)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with open_store(tmp_path) as s:
        got = s.get(TOPIC, 0, 0, 32)
        assert got.unreadable_offsets == [5]
        assert [m.queue_offset for m in got.messages] == [0, 1, 2, 3, 4, 6, 7, 8, 9]
        assert got.next_begin_offset == 10


def test_damaged_record_in_the_middle_is_skipped_not_truncated(tmp_path: pathlib.Path) -> None:
    acked = write_then_crash(tmp_path, 16, queues=1)
    (tmp_path / CHECKPOINT_FILE).unlink()  # force a full validation pass
    victim = acked[6]
    segment = sorted((tmp_path / "commitlog").iterdir())[0]
    with open(segment, "r+b") as f:  # wreck the header: size and magic
        f.seek(victim[3])
        f.write(b"\xde\xad\xbe\xef\xde\xad\xbe\xef")
    with open_store(tmp_path, queues=1) as s:
        r = s.recovery
        assert r.truncated_at is None
        assert r.damaged_ranges == [(victim[3], victim[4])]
        got = s.get(TOPIC, 0, 0, 32)
        assert got.unreadable_offsets == [6]
        assert [m.body for m in got.messages] == [make_message(i).body for i in range(16) if i != 6]


def test_truncated_consume_queue_is_rebuilt(tmp_path: pathlib.Path) -> None:
    with open_store(tmp_path) as s:
        s.put([make_message(i, queue_id=i % 2) for i in range(40)])
    cq = tmp_path / "consumequeue" / TOPIC / "0" / f"{0:020d}"
    os.truncate(cq, 3 * fmt.CQ_UNIT_BYTES + 7)
    with open_store(tmp_path) as s:
        assert s.recovery.queues_rebuilt == [f"{TOPIC}/0"]
        assert s.queue_bounds(TOPIC, 0) == (0, 20)
        assert read_queue(s, 0) == [make_message(i).body for i in range(0, 40, 2)]


def test_deleted_consume_queue_is_rebuilt(tmp_path: pathlib.Path) -> None:
    with open_store(tmp_path) as s:
        s.put([make_message(i, queue_id=i % 4) for i in range(30)])
    for path in (tmp_path / "consumequeue" / TOPIC / "2").iterdir():
        path.unlink()
    with open_store(tmp_path) as s:
        assert s.recovery.queues_rebuilt == [f"{TOPIC}/2"]
        assert read_queue(s, 2) == [make_message(i).body for i in range(2, 30, 4)]


def test_missing_checkpoint_validates_the_whole_log(tmp_path: pathlib.Path) -> None:
    acked = write_then_crash(tmp_path, 90)
    (tmp_path / CHECKPOINT_FILE).unlink()
    with open_store(tmp_path) as s:
        r = s.recovery
        assert r.checkpoint is None and r.scanned_from == 0
        assert r.records_checked == 90 and r.lost_nothing
        assert_all_present(s, acked)


def test_damaged_checkpoint_counts_as_missing(tmp_path: pathlib.Path) -> None:
    acked = write_then_crash(tmp_path, 20)
    path = tmp_path / CHECKPOINT_FILE
    data = bytearray(path.read_bytes())
    data[10] ^= 0x55
    path.write_bytes(bytes(data))
    with open_store(tmp_path) as s:
        assert s.recovery.checkpoint is None and s.recovery.records_checked == 20
        assert_all_present(s, acked)


def test_queue_units_past_the_log_end_are_dropped(tmp_path: pathlib.Path) -> None:
    acked = write_then_crash(tmp_path, 12)
    segment = last_segment(tmp_path)
    cut = acked[8][3] - int(segment.name)  # lose the last 4 records as if never written
    os.truncate(segment, cut)
    (tmp_path / CHECKPOINT_FILE).unlink()
    with open_store(tmp_path) as s:
        assert s.recovery.stale_units_dropped == 4 and s.recovery.truncated_bytes == 0
        assert_all_present(s, acked[:8])


def test_log_ending_in_a_blank_resumes_at_the_next_segment(tmp_path: pathlib.Path) -> None:
    """Killed after the blank that closes a segment, before the next segment got a byte."""
    acked = write_then_crash(tmp_path, 80)
    segments = sorted((tmp_path / "commitlog").iterdir())
    assert len(segments) >= 2
    newest = segments[-1]
    boundary = int(newest.name)
    newest.unlink()
    kept = [a for a in acked if a[3] < boundary]
    with open_store(tmp_path) as s:
        r = s.recovery
        assert r.end_offset == boundary and r.truncated_bytes == 0 and r.damaged_ranges == []
        assert r.stale_units_dropped == len(acked) - len(kept)
        assert_all_present(s, kept)
        assert s.put([make_message(999, queue_id=0)]).appended[0].phys_offset == boundary


def test_a_log_cut_below_its_checkpoint_is_validated_not_trusted(tmp_path: pathlib.Path) -> None:
    """Storage lost bytes the checkpoint vouched for (a disk that acknowledged an fsync it
    did not do, a copy cut short): the torn record is cut, not kept as if valid."""
    acked = write_then_crash(tmp_path, 20)
    with open_store(tmp_path):
        pass  # a clean stop: the checkpoint now names the end of the log
    segment = last_segment(tmp_path)
    os.truncate(segment, segment.stat().st_size - 100)
    last_phys, last_size = acked[-1][3], acked[-1][4]
    with open_store(tmp_path) as s:
        r = s.recovery
        assert r.truncated_at == last_phys and r.truncated_bytes == last_size - 100
        assert_all_present(s, acked[:-1])
        assert s.put([make_message(99, queue_id=0)]).appended[0].phys_offset == last_phys
