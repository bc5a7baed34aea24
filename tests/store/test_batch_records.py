"""Batch records: the messages of one put for one queue stored as one record with one CRC,
each message still read, indexed, copied, recovered and mended on its own terms."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from capstan.broker.store import format as fmt
from capstan.broker.store import record as rec
from capstan.broker.store.message import SYSFLAG_TRANSACTION_PREPARED, Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.properties import PROPERTY_KEYS
from capstan.broker.store.status import PutStatus

from .conftest import SEGMENT_BYTES, TOPIC, make_message, open_store, put_singly
from .test_compaction import TABLE, compact, cuts_at_end, open_compact, read_all
from .test_damaged_records import flip, scrub
from .test_replica_copy import copy_all, same_queues


def batch_starts(store: MessageStore) -> list[int]:
    """The physical offsets of the batch records in the log, walked record by record."""
    starts = []
    for segment in store.commitlog.files.segments:
        data = segment.read(0, segment.length())
        at = 0
        while at + 8 <= len(data):
            size, magic = fmt.SIZE_AND_MAGIC.unpack_from(data, at)
            if magic == fmt.BLANK_MAGIC:
                break
            if magic == fmt.BATCH_MAGIC:
                starts.append(segment.start + at)
            at += size
    return starts


def test_a_put_for_one_queue_is_one_batch_record_read_back_message_by_message(
    store: MessageStore,
) -> None:
    sent = [make_message(i, size=300) for i in range(12)]
    result = store.put(sent)
    assert result.status is PutStatus.PUT_OK
    assert [a.queue_offset for a in result.appended] == list(range(12))
    [start] = batch_starts(store)
    assert result.appended[0].phys_offset == start + fmt.BATCH_HEADER_BYTES + 2 + len(TOPIC)

    got = store.get(TOPIC, 0, 0, max_messages=100)
    assert [m.body for m in got.messages] == [m.body for m in sent]
    assert [m.properties for m in got.messages] == [m.properties for m in sent]
    assert [m.queue_offset for m in got.messages] == list(range(12))
    assert [(m.phys_offset, m.size) for m in got.messages] == [
        (a.phys_offset, a.size) for a in result.appended
    ]
    assert {m.store_timestamp_ms for m in got.messages} == {result.store_timestamp_ms}
    assert len({m.offset_msg_id for m in got.messages}) == 12  # each its own message id
    # One message alone, by its physical offset (index lookups, transaction checks).
    seventh = store.read_message(result.appended[7].phys_offset)
    assert seventh is not None and seventh.body == sent[7].body and seventh.queue_offset == 7
    assert [m.body for m in store.query_by_key(TOPIC, "key-9")] == [sent[9].body]
    # Read from the middle of the batch, a few at a time.
    middle = store.get(TOPIC, 0, 5, max_messages=3)
    assert [m.queue_offset for m in middle.messages] == [5, 6, 7]
    # As a record of its own (a compacted copy holds these): the same message.
    alone = store.stored_record(TOPIC, 0, 4)
    assert alone is not None
    decoded = rec.decode(alone)
    assert (decoded.body, decoded.queue_offset, decoded.phys_offset) == (
        sent[4].body,
        4,
        result.appended[4].phys_offset,
    )
    assert decoded.properties == sent[4].properties


def test_only_consecutive_plain_messages_of_one_queue_share_a_batch(store: MessageStore) -> None:
    half = Message(TOPIC, 0, b"half", {}, sys_flag=SYSFLAG_TRANSACTION_PREPARED)
    mixed = [
        make_message(0, queue_id=0),
        make_message(1, queue_id=0),
        make_message(2, queue_id=1),
        half,
        make_message(3, queue_id=0),
        make_message(4, queue_id=0),
        make_message(5, queue_id=0),
        make_message(6, queue_id=2),
    ]
    result = store.put(mixed)
    assert result.status is PutStatus.PUT_OK
    assert len(batch_starts(store)) == 2  # 0-1 and 3-5; the others are records of their own
    assert [a.queue_offset for a in result.appended] == [0, 1, 0, 0, 2, 3, 4, 0]
    assert [m.body for m in store.get(TOPIC, 0, 0, 10).messages] == [
        make_message(i).body for i in (0, 1, 3, 4, 5)
    ]
    assert [m.body for m in store.get(TOPIC, 1, 0, 10).messages] == [make_message(2).body]
    parked = store.read_message(result.appended[3].phys_offset)
    assert parked is not None and parked.body == b"half"


def test_a_batch_larger_than_a_segment_holds_is_cut_into_several(store: MessageStore) -> None:
    sent = [make_message(i, size=5_000) for i in range(40)]  # ~200 KB, segments of 64 KiB
    result = store.put(sent)
    assert result.status is PutStatus.PUT_OK
    starts = batch_starts(store)
    assert len(starts) >= 4
    assert all(s // SEGMENT_BYTES == (s + 1) // SEGMENT_BYTES for s in starts)
    got = store.get(TOPIC, 0, 0, max_messages=100, max_bytes=10 << 20)
    assert [m.body for m in got.messages] == [m.body for m in sent]


def test_a_flipped_bit_makes_its_whole_batch_unreadable_until_mended(
    tmp_path: pathlib.Path,
) -> None:
    master = open_store(tmp_path / "m", queues=1)
    slave = open_store(tmp_path / "s", queues=1)
    try:
        for i in range(0, 30, 10):
            assert master.put([make_message(j) for j in range(i, i + 10)]).status.ok
        copy_all(master, slave)
        _, second, _ = batch_starts(slave)
        flip(slave, second, 3_000)  # inside the fourth entry's body or so
        got = slave.get(TOPIC, 0, 0, max_messages=100)
        # One CRC for the batch: all ten of its messages are unreadable, the others not.
        assert got.unreadable_offsets == list(range(10, 20))
        assert [m.queue_offset for m in got.messages] == [*range(10), *range(20, 30)]
        assert scrub(slave, 1 << 20) == ([second], False)
        seen: list[int] = []
        slave.damage_seen = seen.append
        assert slave.get(TOPIC, 0, 15, max_messages=1).unreadable_offsets == [15]
        assert seen == [second]  # the batch record, which is what is fetched and mended
        assert slave.heal_record(second, master.sound_record(second)) is True
        assert scrub(slave, 1 << 20) == ([], False)
        same_queues(master, slave, queues=1)
    finally:
        master.close()
        slave.close()


def test_replicas_copy_batches_and_dispatch_their_entries_as_the_master_did(
    tmp_path: pathlib.Path,
) -> None:
    master = open_store(tmp_path / "m")
    slave = open_store(tmp_path / "s")
    try:
        for i in range(0, 400, 20):  # batches over several segments and all four queues
            batch = [make_message(j, queue_id=(i // 20) % 4) for j in range(i, i + 20)]
            assert master.put(batch).status.ok
        copy_all(master, slave, max_bytes=3_000)
        same_queues(master, slave)
        found = slave.query_by_key(TOPIC, "key-321")
        assert [m.body for m in found] == [make_message(321).body]
    finally:
        master.close()
        slave.close()


CRASH_IN_A_BATCH = """
import os, sys
sys.path.insert(0, {tests!r})
from store.conftest import open_store, make_message
store = open_store({root!r}, queues=1)
for i in range(0, 30, 10):
    assert store.put([make_message(j) for j in range(i, i + 10)]).status.ok
print(store.max_phys_offset, flush=True)
os._exit(0)  # no close: recovery runs at the next open, as after kill -9
"""


def test_a_torn_batch_is_cut_whole_at_recovery(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "s"
    tests = str(pathlib.Path(__file__).resolve().parents[1])
    code = CRASH_IN_A_BATCH.format(tests=tests, root=str(root))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    end = int(out.stdout)
    with open_store(root, queues=1) as store:
        _, _, third = batch_starts(store)
    # The last batch written only in part (its write torn by the crash), and its tail zero.
    segment = sorted((root / "commitlog").iterdir())[-1]
    torn_at = third + (end - third) // 2
    os.truncate(segment, torn_at - int(segment.name))
    with open_store(root, queues=1) as store:
        assert store.recovery.truncated_at == third
        assert store.max_phys_offset == third
        got = store.get(TOPIC, 0, 0, max_messages=100)
        assert [m.queue_offset for m in got.messages] == list(range(20))  # none of it kept
        assert got.next_begin_offset == 20
        again = store.put([make_message(j) for j in range(100, 110)])
        assert [a.queue_offset for a in again.appended] == list(range(20, 30))


def test_recovery_without_a_checkpoint_rebuilds_queues_of_batch_entries(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "s"
    with open_store(root, queues=2) as store:
        for i in range(0, 200, 25):
            assert store.put([make_message(j, queue_id=i % 2) for j in range(i, i + 25)]).status.ok
        before = [store.get(TOPIC, q, 0, 500).messages for q in (0, 1)]
    assert [len(messages) for messages in before] == [64, 64]  # the most one get returns
    for path in (root / "consumequeue").rglob("*"):
        if path.is_file():
            path.unlink()
    (root / "checkpoint").unlink()
    with open_store(root, queues=2) as store:
        after = [store.get(TOPIC, q, 0, 500).messages for q in (0, 1)]
        for old, new in zip(before, after, strict=True):
            assert [(m.queue_offset, m.phys_offset, m.size, m.body) for m in new] == [
                (m.queue_offset, m.phys_offset, m.size, m.body) for m in old
            ]


def test_compaction_keeps_messages_of_batch_records_as_records_of_their_own(
    tmp_path: pathlib.Path,
) -> None:
    store = open_compact(tmp_path / "c")
    try:
        for round_ in range(4):  # each round one batch record per queue
            for q in range(2):
                batch = [
                    Message(TABLE, q, f"v{round_}-{k}".encode(), {PROPERTY_KEYS: f"k{k}"})
                    for k in range(q, 6, 2)
                ]
                assert store.put(batch).status is PutStatus.PUT_OK
        assert len(batch_starts(store)) == 8
        before = {
            (m.queue_offset, m.phys_offset, m.offset_msg_id)
            for q in range(2)
            for m in store.get(TABLE, q, 0, 100).messages
        }
        generation, outcomes = compact(store, cuts_at_end(store))
        assert generation == 1
        assert [(o.kept, o.dropped) for o in outcomes] == [(3, 9), (3, 9)]
        expected = [[(9, "k0", b"v3-0"), (10, "k2", b"v3-2"), (11, "k4", b"v3-4")]]
        expected.append([(9, "k1", b"v3-1"), (10, "k3", b"v3-3"), (11, "k5", b"v3-5")])
        assert [read_all(store, q) for q in range(2)] == expected
        kept = {
            (m.queue_offset, m.phys_offset, m.offset_msg_id)
            for q in range(2)
            for m in store.get(TABLE, q, 0, 100).messages
        }
        assert kept <= before  # the same offsets and message ids as in their batches
    finally:
        store.close()
    reopened = open_compact(tmp_path / "c")
    try:
        assert [read_all(reopened, q) for q in range(2)] == expected
    finally:
        reopened.close()


def test_a_damaged_entry_is_traced_to_its_batch_record_even_when_its_own_framing_is_gone(
    store: MessageStore,
) -> None:
    assert put_singly(store, [make_message(i) for i in range(3)])  # records of their own
    batch = store.put([make_message(i) for i in range(3, 13)]).appended
    [start] = batch_starts(store)
    log = store.commitlog
    assert log.record_holding(batch[4].phys_offset) == start  # from the entry's own back
    assert log.record_holding(batch[4].phys_offset + 100) == start  # a byte inside it
    assert log.record_holding(start) == start
    flip(store, batch[4].phys_offset, fmt.ENTRY_BACK_AT + 1)  # its way back, wrong now
    assert log.record_holding(batch[4].phys_offset) == start  # walked from the segment's start
    seen: list[int] = []
    store.damage_seen = seen.append
    got = store.get(TOPIC, 0, 3, max_messages=20)
    assert got.unreadable_offsets == list(range(3, 13))
    assert set(seen) == {start}
