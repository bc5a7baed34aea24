"""A slave's copy of the master's CommitLog: byte for byte at the same offsets, consume
queues and index rebuilt from it, a restart that recovers it, and cutting a divergent tail
back before copying from a new master."""

from __future__ import annotations

import pathlib

import pytest

from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.status import GetStatus, PutStatus

from .conftest import SEGMENT_BYTES, TOPIC, make_message, open_store, put_singly


def copy_all(master: MessageStore, slave: MessageStore, max_bytes: int = 5_000) -> int:
    """Copy as a replication stream would; return how many chunks it took."""
    chunks = 0
    while slave.max_phys_offset < master.max_phys_offset:
        offset = slave.max_phys_offset
        data, after = master.read_for_replica(offset, max_bytes)
        assert data, "the master has bytes past the slave's end"
        slave.append_replica_copy(offset, data)
        assert slave.max_phys_offset == after
        chunks += 1
    return chunks


def log_bytes(store: MessageStore) -> bytes:
    return b"".join(seg.read(0, seg.length()) for seg in store.commitlog.files.segments)


def same_queues(master: MessageStore, slave: MessageStore, queues: int = 4) -> None:
    for q in range(queues):
        assert slave.queue_bounds(TOPIC, q) == master.queue_bounds(TOPIC, q)
        mine = slave.get(TOPIC, q, 0, max_messages=1000)
        theirs = master.get(TOPIC, q, 0, max_messages=1000)
        assert [(m.queue_offset, m.phys_offset, m.body) for m in mine.messages] == [
            (m.queue_offset, m.phys_offset, m.body) for m in theirs.messages
        ]


def test_a_copy_is_the_same_log_with_the_same_queues_and_keys(tmp_path: pathlib.Path) -> None:
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s")
    try:
        for i in range(0, 300, 10):  # crosses several 64 KiB segments
            assert master.put([make_message(j, queue_id=j % 4) for j in range(i, i + 10)]).status.ok
        chunks = copy_all(master, slave)
        assert chunks > len(master.commitlog.files.segments)  # small chunks, whole records
        assert slave.max_phys_offset == master.max_phys_offset
        assert log_bytes(slave) == log_bytes(master)
        assert [s.start for s in slave.commitlog.files.segments] == [
            s.start for s in master.commitlog.files.segments
        ]
        same_queues(master, slave)
        found = slave.query_by_key(TOPIC, "key-123", max_results=4)
        assert [m.body for m in found] == [make_message(123).body]
        # The copy takes writes of its own when promoted: queue offsets go on densely.
        result = slave.put([make_message(1000, queue_id=1)])
        assert result.status is PutStatus.PUT_OK
        assert result.appended[0].queue_offset == master.queue_bounds(TOPIC, 1)[1]  # type: ignore[index]
    finally:
        master.close()
        slave.close()


def test_a_record_larger_than_the_chunk_is_sent_whole(tmp_path: pathlib.Path) -> None:
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s")
    try:
        assert put_singly(master, [make_message(1, size=20_000), make_message(2, size=100)])
        assert copy_all(master, slave, max_bytes=1_000) == 2
        same_queues(master, slave)
    finally:
        master.close()
        slave.close()


def test_chunks_written_before_their_dispatch_all_reach_the_queues(tmp_path: pathlib.Path) -> None:
    # A slave acknowledges a chunk once written and dispatches it after; several chunks
    # may be written before one dispatch, and none of them is skipped. The slave's
    # housekeeping (which dispatches what is pending) is kept out of the way.
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s", checkpoint_interval_ms=3_600_000)
    try:
        for i in range(0, 120, 10):
            assert master.put([make_message(j, queue_id=j % 4) for j in range(i, i + 10)]).status.ok
        chunks = 0
        while slave.max_phys_offset < master.max_phys_offset:
            data, _ = master.read_for_replica(slave.max_phys_offset, 5_000)
            slave.write_replica_copy(slave.max_phys_offset, data)
            chunks += 1
        assert chunks > 3
        assert log_bytes(slave) == log_bytes(master)
        assert slave.get(TOPIC, 0, 0, max_messages=1000).messages == []  # held, not dispatched
        slave.dispatch_copied()
        same_queues(master, slave)
        found = slave.query_by_key(TOPIC, "key-7", max_results=4)
        assert [m.body for m in found] == [make_message(7).body]
    finally:
        master.close()
        slave.close()


def test_a_copy_that_does_not_continue_the_log_is_refused(tmp_path: pathlib.Path) -> None:
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s")
    try:
        assert put_singly(master, [make_message(i) for i in range(20)])
        first, _ = master.read_for_replica(0, 3_000)
        slave.append_replica_copy(0, first)
        second, _ = master.read_for_replica(len(first), 3_000)
        with pytest.raises(ValueError, match="does not continue"):
            slave.append_replica_copy(len(first) + len(second), second)  # skips a chunk
        with pytest.raises(ValueError, match="does not continue"):
            slave.append_replica_copy(0, first)  # again
        assert slave.max_phys_offset == len(first)
        copy_all(master, slave)
        same_queues(master, slave)
    finally:
        master.close()
        slave.close()


def test_a_copy_survives_a_crash_of_the_slave(tmp_path: pathlib.Path) -> None:
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s")
    try:
        master.put([make_message(i, queue_id=i % 4) for i in range(150)])
        copy_all(master, slave)
        slave.commitlog.sync()
        slave._closed = True  # abandon it as kill -9 would: no checkpoint, no clean mark
        slave._stop.set()
        slave._lock_file.release()
        again = open_store(tmp_path / "s")
        try:
            assert again.max_phys_offset == master.max_phys_offset
            same_queues(master, again)
            master.put([make_message(i, queue_id=i % 4) for i in range(150, 170)])
            copy_all(master, again)
            same_queues(master, again)
        finally:
            again.close()
    finally:
        master.close()


def test_cutting_a_divergent_tail_and_copying_from_the_new_master(
    tmp_path: pathlib.Path,
) -> None:
    """Old master A and slave B share 100 messages; A wrote 30 more that B never got;
    B became master and wrote 20 of its own. A cuts back to the shared end and copies."""
    a = open_store(tmp_path / "a")
    b = open_store(tmp_path / "b")
    try:
        a.put([make_message(i, queue_id=i % 4) for i in range(100)])
        copy_all(a, b)
        shared = a.max_phys_offset
        a.put([make_message(i, queue_id=i % 4, tag="lost") for i in range(100, 130)])
        b.put([make_message(i, queue_id=i % 4, tag="kept") for i in range(200, 220)])
        a.truncate_log(shared)
        assert a.max_phys_offset == shared
        assert all(a.queue_bounds(TOPIC, q) == (0, 25) for q in range(4))
        assert a.query_by_key(TOPIC, "key-105", max_results=4) == []
        copy_all(b, a)
        assert log_bytes(a) == log_bytes(b)
        same_queues(b, a)
        got = a.get(TOPIC, 1, 25, max_messages=10)
        assert got.status is GetStatus.FOUND
        assert {m.properties["TAGS"] for m in got.messages} == {"kept"}
    finally:
        a.close()
        b.close()


def test_cutting_to_a_segment_start_removes_the_later_segments(tmp_path: pathlib.Path) -> None:
    store = open_store(tmp_path / "s")
    try:
        store.put([make_message(i) for i in range(200)])
        assert len(store.commitlog.files.segments) >= 3
        store.truncate_log(SEGMENT_BYTES)
        assert [s.start for s in store.commitlog.files.segments] == [0]
        assert store.max_phys_offset == SEGMENT_BYTES  # the first segment's blank included
        result = store.put([make_message(500)])
        assert result.appended[0].phys_offset == store.max_phys_offset - result.appended[0].size
    finally:
        store.close()


def test_reads_stop_at_the_read_limit_until_it_moves(tmp_path: pathlib.Path) -> None:
    store = open_store(tmp_path / "m")
    try:
        put = store.put([make_message(j, queue_id=0) for j in range(3)])
        assert put.status.ok
        second_end = put.appended[1].phys_offset + put.appended[1].size
        store.read_limit = second_end  # the replicas hold the first two only
        got = store.get(TOPIC, 0, 0, max_messages=10)
        assert [m.queue_offset for m in got.messages] == [0, 1]
        assert got.next_begin_offset == 2
        at_limit = store.get(TOPIC, 0, 2, max_messages=10)
        assert at_limit.status is GetStatus.OFFSET_OVERFLOW_ONE  # a long poll waits here
        assert at_limit.next_begin_offset == 2 and not at_limit.messages
        store.read_limit = store.max_phys_offset
        assert [m.queue_offset for m in store.get(TOPIC, 0, 2).messages] == [2]
    finally:
        store.close()


def test_cutting_the_log_while_housekeeping_checkpoints(tmp_path: pathlib.Path) -> None:
    """A cut writes a checkpoint while the housekeeping thread writes its own every
    millisecond: both finish, and a reopen finds the log where the last cut left it."""
    store = open_store(tmp_path / "s", checkpoint_interval_ms=1)
    try:
        store.put([make_message(i, queue_id=i % 4) for i in range(20)])
        kept = store.max_phys_offset
        for round_no in range(150):
            store.put([make_message(1000 + round_no, queue_id=round_no % 4, tag="cut")])
            store.truncate_log(kept)
        assert store.max_phys_offset == kept
    finally:
        store.close()
    reopened = open_store(tmp_path / "s")
    try:
        assert reopened.max_phys_offset == kept
        assert sum(reopened.queue_bounds(TOPIC, q)[1] for q in range(4)) == 20
    finally:
        reopened.close()
