"""Records damaged at rest: a scrub finds every one (and steps over those whose framing
still holds), another replica's sound copy is written over a damaged one, and nothing
that is not a sound copy of that very record is ever written. Messages are put one by one
(records of their own) unless a test is about batch records."""

from __future__ import annotations

import os
import pathlib

import pytest

from capstan.broker.store import format as fmt
from capstan.broker.store import record as rec
from capstan.broker.store.message_store import MessageStore

from .conftest import SEGMENT_BYTES, TOPIC, make_message, open_store, put_singly
from .test_replica_copy import copy_all


def flip(store: MessageStore, phys: int, at: int) -> None:
    """Flip one bit of the byte `at` bytes into the record at `phys`, on disk."""
    segment = store.commitlog.files.find(phys)
    assert segment is not None
    where = phys - segment.start + at
    byte = os.pread(segment.fd, 1, where)
    os.pwrite(segment.fd, bytes([byte[0] ^ 0x10]), where)


def scrub(store: MessageStore, step: int) -> tuple[list[int], bool]:
    """Check the whole log `step` bytes at a time, as the healer does."""
    found: list[int] = []
    skipped = False
    offset = store.min_phys_offset
    while offset < store.max_phys_offset:
        check = store.check_records(offset, step)
        found += check.damaged
        skipped |= check.skipped
        assert check.next_offset > offset
        offset = check.next_offset
    return found, skipped


def phys_of(store: MessageStore, queue_offset: int) -> int:
    [message] = store.get(TOPIC, 0, queue_offset, max_messages=1).messages
    return message.phys_offset


@pytest.mark.parametrize("step", [1, 3_000, 1 << 20])
def test_a_scrub_finds_each_damaged_record_across_segments(
    tmp_path: pathlib.Path, step: int
) -> None:
    store = open_store(tmp_path / "s", queues=1)
    try:
        for i in range(0, 200, 20):  # over three 64 KiB segments, with blank fillers
            assert put_singly(store, [make_message(j) for j in range(i, i + 20)])
        assert len(store.commitlog.files.segments) >= 3
        assert scrub(store, step) == ([], False)
        bad = [phys_of(store, n) for n in (3, 70, 199)]
        flip(store, bad[0], fmt.RECORD_HEADER_BYTES + 5)  # the body
        flip(store, bad[1], 40)  # the header: born timestamp
        flip(store, bad[2], 1000)  # near the record CRC
        assert scrub(store, step) == (bad, False)
        # A read meets the damage too, and tells whoever listens.
        seen: list[int] = []
        store.damage_seen = seen.append
        result = store.get(TOPIC, 0, 70, max_messages=1)
        assert result.messages == [] and result.unreadable_offsets == [70]
        assert seen == [bad[1]]
    finally:
        store.close()


def test_a_record_whose_framing_is_gone_ends_the_check_of_its_segment_until_it_is_mended(
    tmp_path: pathlib.Path,
) -> None:
    master = open_store(tmp_path / "m", queues=1)
    slave = open_store(tmp_path / "s", queues=1)
    try:
        assert put_singly(master, [make_message(j) for j in range(150)])
        copy_all(master, slave)
        damaged, later = phys_of(slave, 10), phys_of(slave, 120)
        assert damaged // SEGMENT_BYTES != later // SEGMENT_BYTES
        flip(slave, damaged, 5)  # the magic number: nothing says where the record ends
        flip(slave, later, 500)  # in a later segment: still found
        assert scrub(slave, 1 << 20) == ([damaged, later], True)
        with pytest.raises(rec.CorruptRecord):
            slave.read_message(damaged)

        assert slave.heal_record(damaged, master.sound_record(damaged)) is True
        assert scrub(slave, 1 << 20) == ([later], False)
        assert slave.read_message(damaged).body == make_message(10).body  # type: ignore[union-attr]
        assert slave.heal_record(damaged, master.sound_record(damaged)) is False  # sound now
    finally:
        master.close()
        slave.close()


def test_only_a_sound_copy_of_that_very_record_is_written(tmp_path: pathlib.Path) -> None:
    master = open_store(tmp_path / "m", queues=1)
    slave = open_store(tmp_path / "s", queues=1)
    try:
        assert put_singly(master, [make_message(j) for j in range(30)])
        copy_all(master, slave)
        first, second = phys_of(master, 4), phys_of(master, 5)
        flip(slave, first, 200)
        before = slave.commitlog.read(first, second - first)
        copy = bytearray(master.sound_record(first))
        copy[300] ^= 1
        refused = [
            bytes(copy),  # damaged in transit
            master.sound_record(second),  # another record (its own offset inside says so)
            master.sound_record(first)[:-1],  # cut short
        ]
        for bad in refused:
            with pytest.raises(ValueError):
                slave.heal_record(first, bad)
        assert slave.commitlog.read(first, second - first) == before
        with pytest.raises(ValueError):  # past the end of the slave's log
            slave.heal_record(master.max_phys_offset, master.sound_record(first))
        # The master's own damaged copy is never handed out.
        flip(master, second, 200)
        with pytest.raises(rec.CorruptRecord):
            master.sound_record(second)
        with pytest.raises(rec.CorruptRecord):  # no record starts there
            master.sound_record(first + 8)
    finally:
        master.close()
        slave.close()


def test_a_mended_record_survives_a_restart(tmp_path: pathlib.Path) -> None:
    master = open_store(tmp_path / "m", queues=1)
    slave = open_store(tmp_path / "s", queues=1)
    try:
        assert put_singly(master, [make_message(j) for j in range(30)])
        copy_all(master, slave)
        damaged = phys_of(slave, 7)
        flip(slave, damaged, fmt.RECORD_HEADER_BYTES)
        assert slave.heal_record(damaged, master.sound_record(damaged))
    finally:
        master.close()
        slave.close()
    reopened = open_store(tmp_path / "s", queues=1)
    try:
        got = reopened.get(TOPIC, 0, 0, max_messages=100)
        assert [m.body for m in got.messages] == [make_message(j).body for j in range(30)]
        assert scrub(reopened, SEGMENT_BYTES) == ([], False)
    finally:
        reopened.close()
