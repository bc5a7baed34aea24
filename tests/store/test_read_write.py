"""Appending and reading back: round trip, segment rollover, consume queues, index, tags."""

from __future__ import annotations

import os
import pathlib
import time

import pytest

from capstan.broker.store import format as fmt
from capstan.broker.store.message import SYSFLAG_TRANSACTION_PREPARED, Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.status import GetStatus, PutStatus

from .conftest import SEGMENT_BYTES, TOPIC, make_message, open_store


def test_round_trip_keeps_every_field(store: MessageStore) -> None:
    sent = make_message(7, queue_id=2)
    sent.flag, sent.reconsume_times, sent.born_timestamp_ms = 5, 3, 1_700_000_000_000
    result = store.put([sent])
    assert result.status is PutStatus.PUT_OK
    [appended] = result.appended
    got = store.get(TOPIC, 2, 0)
    assert got.status is GetStatus.FOUND
    [msg] = got.messages
    assert (msg.topic, msg.queue_id, msg.queue_offset) == (TOPIC, 2, 0)
    assert msg.body == sent.body
    assert msg.properties == sent.properties
    assert (msg.flag, msg.reconsume_times, msg.born_timestamp_ms) == (5, 3, 1_700_000_000_000)
    assert msg.phys_offset == appended.phys_offset
    assert abs(msg.store_timestamp_ms - time.time() * 1000) < 10_000
    assert store.read_message(appended.phys_offset).body == sent.body  # type: ignore[union-attr]


def test_queue_offsets_are_per_queue_and_dense(store: MessageStore) -> None:
    batch = [make_message(i, queue_id=i % 3) for i in range(30)]
    result = store.put(batch)
    assert [a.queue_offset for a in result.appended] == [i // 3 for i in range(30)]
    for q in range(3):
        got = store.get(TOPIC, q, 0, max_messages=100)
        assert [m.queue_offset for m in got.messages] == list(range(10))
        assert [m.body for m in got.messages] == [b.body for b in batch if b.queue_id == q]
        assert got.next_begin_offset == 10


def test_batch_goes_out_in_one_write(store: MessageStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store.put([make_message(0)])
    segment = store.commitlog.files.last
    assert segment is not None
    writes: list[int] = []
    real_pwrite = os.pwrite

    def counting_pwrite(fd: int, data: bytes, position: int) -> int:
        if fd == segment.fd:
            writes.append(len(data))
        return real_pwrite(fd, data, position)

    monkeypatch.setattr(os, "pwrite", counting_pwrite)
    result = store.put([make_message(i) for i in range(10)])
    # One batch record: its header and topic, then each message's entry, back to back.
    sizes = [a.size for a in result.appended]
    header = fmt.BATCH_HEADER_BYTES + 2 + len(TOPIC)
    assert writes == [header + sum(sizes)]
    positions = [a.phys_offset for a in result.appended]
    assert positions == [positions[0] + sum(sizes[:i]) for i in range(10)]
    got = store.get(TOPIC, 0, 1, max_messages=20)
    assert [m.body for m in got.messages] == [make_message(i).body for i in range(10)]
    assert [m.phys_offset for m in got.messages] == positions


def test_rollover_fills_segment_with_blank_and_names_files_by_offset(store: MessageStore) -> None:
    for i in range(200):
        assert store.put([make_message(i)]).status.ok
    names = sorted(p.name for p in (store.root / "commitlog").iterdir())
    assert len(names) >= 3
    assert names == [f"{n * SEGMENT_BYTES:020d}" for n in range(len(names))]
    first = (store.root / "commitlog" / names[0]).read_bytes()
    size, magic = fmt.BLANK_RECORD.unpack_from(first, len(first) - fmt.BLANK_RECORD_BYTES)
    assert magic == fmt.BLANK_MAGIC and size == fmt.BLANK_RECORD_BYTES + SEGMENT_BYTES - len(first)
    got = store.get(TOPIC, 0, 0, max_messages=200)
    assert [m.body for m in got.messages][:32] == [make_message(i).body for i in range(32)]
    offset, bodies = 0, []
    while (res := store.get(TOPIC, 0, offset, 32)).messages:
        bodies += [m.body for m in res.messages]
        offset = res.next_begin_offset
    assert bodies == [make_message(i).body for i in range(200)]


def test_get_statuses_at_edges(store: MessageStore) -> None:
    assert store.get("NoSuchTopic", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.get(TOPIC, 99, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    assert store.get(TOPIC, 1, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    store.put([make_message(i, queue_id=1) for i in range(3)])
    assert store.get(TOPIC, 1, 3).status is GetStatus.OFFSET_OVERFLOW_ONE
    bad = store.get(TOPIC, 1, 10)
    assert bad.status is GetStatus.OFFSET_OVERFLOW_BADLY and bad.next_begin_offset == 3
    assert store.queue_bounds(TOPIC, 1) == (0, 3)


def test_tag_filter_uses_queue_hash_and_exact_match(store: MessageStore) -> None:
    store.put([make_message(i, tag="red" if i % 2 else "blue") for i in range(20)])
    got = store.get(TOPIC, 0, 0, max_messages=5, tags={"red"})
    assert got.status is GetStatus.FOUND
    assert all(m.tags == "red" for m in got.messages) and len(got.messages) == 5
    none = store.get(TOPIC, 0, 0, max_messages=5, tags={"green"})
    assert none.status is GetStatus.NO_MATCHED_MESSAGE and none.next_begin_offset > 0


def test_lookup_by_key_message_id_and_time(store: MessageStore) -> None:
    store.put([make_message(i, queue_id=i % 4) for i in range(50)])
    [by_key] = store.query_by_key(TOPIC, "key-17")
    assert by_key.body == make_message(17).body
    by_id = store.query_by_msg_id(TOPIC, f"ID{23:020d}")
    assert by_id is not None and by_id.body == make_message(23).body
    by_offset_id = store.query_by_msg_id(TOPIC, by_key.offset_msg_id)
    assert by_offset_id is not None and by_offset_id.phys_offset == by_key.phys_offset
    assert store.query_by_key(TOPIC, "key-17", begin_ms=0, end_ms=1000) == []
    assert store.query_by_key("OtherTopic", "key-17") == []
    assert store.query_by_key(TOPIC, "key-999") == []


def test_offset_for_time(store: MessageStore) -> None:
    store.put([make_message(i) for i in range(5)])
    time.sleep(0.02)
    middle = time.time_ns() // 1_000_000
    time.sleep(0.02)
    store.put([make_message(i) for i in range(5, 10)])
    assert store.offset_for_time(TOPIC, 0, 0) == 0
    assert store.offset_for_time(TOPIC, 0, middle) == 5
    assert store.offset_for_time(TOPIC, 0, middle + 3_600_000) == 10


def test_prepared_transaction_is_stored_but_not_visible(store: MessageStore) -> None:
    half = make_message(1)
    half.sys_flag = SYSFLAG_TRANSACTION_PREPARED
    result = store.put([half, make_message(2)])
    assert [a.queue_offset for a in result.appended] == [0, 0]
    assert [m.body for m in store.get(TOPIC, 0, 0).messages] == [make_message(2).body]
    assert store.read_message(result.appended[0].phys_offset).body == half.body  # type: ignore[union-attr]


def test_data_survives_clean_reopen(tmp_path: pathlib.Path) -> None:
    with open_store(tmp_path) as s:
        s.put([make_message(i, queue_id=i % 4) for i in range(100)])
    with open_store(tmp_path) as s:
        assert not s.recovery.crashed and s.recovery.records_checked == 0
        assert s.queue_bounds(TOPIC, 3) == (0, 25)
        assert [m.body for m in s.get(TOPIC, 3, 20).messages] == [
            make_message(i).body for i in range(83, 100, 4)
        ]
        assert s.put([make_message(100, queue_id=3)]).appended[0].queue_offset == 25


def test_property_separator_bytes_are_refused(store: MessageStore) -> None:
    bad = Message(TOPIC, 0, b"x", {"a\x01b": "c"})
    assert store.put([bad]).status is PutStatus.MESSAGE_ILLEGAL
