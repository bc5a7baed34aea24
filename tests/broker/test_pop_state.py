"""The pop journal: replay after a crash, torn last lines, compaction, handle checks."""

from __future__ import annotations

import errno
import hmac
import os
import time
from pathlib import Path

import pytest

from capstan.broker.pop import pop_state
from capstan.broker.pop.pop_state import PopState
from capstan.broker.pop.receipt_handle import HandleCodec, ReceiptHandle

KEY = ("G", "T", 0)


def fresh(root: Path, compact_bytes: int = 1 << 30) -> PopState:
    return PopState(root / "pop", compact_bytes)


def test_replay_restores_in_flight_and_next_offset(tmp_path):
    state = fresh(tmp_path)
    q = state.ensure(KEY, 5)
    seqs = [state.issue(KEY, q, off, 1_000 + off, 1) for off in (5, 6, 7)]
    state.advance(KEY, q, 8)
    state.done(KEY, q, 6)
    state.write()
    # No close: as after kill -9, only what was written counts.
    again = fresh(tmp_path)
    q2 = again.queues[KEY]
    assert q2.next_offset == 8
    assert {off: e.seq for off, e in q2.inflight.items()} == {5: seqs[0], 7: seqs[2]}
    assert q2.ack_offset == 5
    assert again.issue(KEY, q2, 8, 0, 1) > max(seqs)  # sequence numbers never repeat


def test_unwritten_changes_are_not_replayed_and_a_torn_line_is_ignored(tmp_path):
    state = fresh(tmp_path)
    q = state.ensure(KEY, 0)
    state.issue(KEY, q, 0, 10, 1)
    state.write()
    state.issue(KEY, q, 1, 10, 1)  # never written
    with open(next((tmp_path / "pop").glob("journal.*")), "ab") as f:
        f.write(b"P G T 0 9 99")  # torn mid-line
    again = fresh(tmp_path)
    assert set(again.queues[KEY].inflight) == {0}


def test_a_write_the_disk_cuts_short_leaves_no_torn_line_and_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = fresh(tmp_path)
    q = state.ensure(KEY, 0)
    state.issue(KEY, q, 0, 10, 1)
    state.write()
    state.issue(KEY, q, 1, 10, 1)
    real_write, calls = os.write, []

    def half_then_full(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        state.write()
    monkeypatch.undo()
    assert set(fresh(tmp_path).queues[KEY].inflight) == {0}  # the half line was cut off
    state.issue(KEY, q, 2, 10, 1)
    state.write()  # space again: the change the disk refused is written with the next
    assert set(fresh(tmp_path).queues[KEY].inflight) == {0, 1, 2}


def test_reset_drops_in_flight(tmp_path):
    state = fresh(tmp_path)
    q = state.ensure(KEY, 0)
    state.issue(KEY, q, 0, 10, 1)
    state.reset(KEY, 42)
    state.write()
    again = fresh(tmp_path)
    assert again.queues[KEY].next_offset == 42 and not again.queues[KEY].inflight


def test_compaction_keeps_the_state_and_starts_a_small_journal(tmp_path):
    state = fresh(tmp_path, compact_bytes=2_000)
    q = state.ensure(KEY, 0)
    for off in range(200):
        state.issue(KEY, q, off, 5, 1)
        state.advance(KEY, q, off + 1)
        if off % 2:
            state.done(KEY, q, off)
        state.write()
    journals = list((tmp_path / "pop").glob("journal.*"))
    assert len(journals) == 1 and journals[0].stat().st_size < 2_000
    assert (tmp_path / "pop" / "snapshot.json").exists()
    again = fresh(tmp_path)
    assert again.queues[KEY].next_offset == 200
    assert set(again.queues[KEY].inflight) == set(range(0, 200, 2))


def test_receipt_handles_are_bound_to_group_topic_and_key(tmp_path):
    codec = HandleCodec.from_key_file(tmp_path / "k")
    handle = codec.encode("G", "T", ReceiptHandle(3, 77, 9))
    assert codec.decode("G", "T", handle) == ReceiptHandle(3, 77, 9)
    assert codec.decode("G2", "T", handle) is None
    assert codec.decode("G", "T2", handle) is None
    tampered = handle.replace(".4d.", ".4e.")
    assert codec.decode("G", "T", tampered) is None
    assert codec.decode("G", "T", "") is None
    # The key survives a restart, so handles issued before it still work.
    assert HandleCodec.from_key_file(tmp_path / "k").decode("G", "T", handle) is not None
    assert HandleCodec.from_key_file(tmp_path / "other").decode("G", "T", handle) is None


def test_handles_issued_before_the_blake2_tag_are_still_accepted(tmp_path):
    """Brokers before this one tagged handles with HMAC-SHA256 ("c1"); messages handed out
    by them must stay ackable after an upgrade, and a forged old-style handle must not."""
    codec = HandleCodec.from_key_file(tmp_path / "k")
    body = f"c1.{3:x}.{77:x}.{9:x}"
    old_tag = hmac.digest(codec.key, f"G\nT\n{body}".encode(), "sha256").hex()[:16]
    assert codec.decode("G", "T", f"{body}.{old_tag}") == ReceiptHandle(3, 77, 9)
    assert codec.decode("G2", "T", f"{body}.{old_tag}") is None
    assert codec.decode("G", "T", f"{body}.{'0' * 16}") is None
    assert codec.encode("G", "T", ReceiptHandle(3, 77, 9)).startswith("c2.")


def test_a_promoted_slave_hands_back_only_what_the_master_handed_out_last(tmp_path):
    master, slave = fresh(tmp_path / "master"), fresh(tmp_path / "slave")
    q = master.ensure(KEY, 0)
    early = master.issue(KEY, q, 0, 900_000, 1)
    master.write()
    slave.replace_all(master.export())  # the copy holding the early hand-out
    heard_after_early = time.monotonic()
    time.sleep(0.01)
    late = master.issue(KEY, q, 1, 900_000, 1)
    master.write()
    slave.replace_all(master.export())  # the copy holding the late one
    handed_back = slave.hand_back_recent(heard_after_early, 5_000)
    assert handed_back == 1
    inflight = slave.queues[KEY].inflight
    assert (inflight[0].seq, inflight[0].visible_at_ms) == (early, 900_000)
    assert (inflight[1].seq, inflight[1].visible_at_ms) == (late, 5_000)  # same handle
    assert slave.queues[KEY].next_due_ms == 5_000
    slave.write()
    again = fresh(tmp_path / "slave")  # journaled: it outlives a restart
    assert again.queues[KEY].inflight[1].visible_at_ms == 5_000


def test_a_slave_fed_the_masters_changes_holds_what_a_whole_copy_would(tmp_path):
    master, slave = fresh(tmp_path / "master"), fresh(tmp_path / "slave")
    slave.replace_all(master.export())
    sent = master.version
    q = master.ensure(KEY, 3)
    for off in (3, 4, 5):
        master.issue(KEY, q, off, 10_000 + off, 1)
    master.advance(KEY, q, 6)
    master.write()
    master.done(KEY, q, 4)
    master.issue(KEY, q, 5, 2_000, 2)  # a changed invisible time
    master.write()
    changes = master.changes_since(sent)
    assert changes is not None and changes.count("\n") == 7
    assert master.changes_since(master.version) == ""
    slave.apply_changes(changes)
    assert slave.export()["queues"] == master.export()["queues"]
    assert slave.queues[KEY].next_due_ms == 2_000
    assert slave.issue(KEY, slave.queues[KEY], 6, 0, 1) > q.inflight[5].seq  # no handle reused
    again = fresh(tmp_path / "slave")  # journaled on the slave: it outlives a restart
    assert again.queues[KEY].inflight.keys() == {3, 5}


def test_changes_no_longer_kept_or_across_a_whole_copy_are_not_offered(tmp_path, monkeypatch):
    state = fresh(tmp_path)
    q = state.ensure(KEY, 0)
    for off in range(5):
        state.issue(KEY, q, off, 1_000, 1)
        state.write()
    assert state.changes_since(0) is not None
    assert state.changes_since(state.version + 1) is None  # a version it never had
    monkeypatch.setattr(pop_state, "CHANGES_KEPT", 2)
    short = fresh(tmp_path / "short")
    q = short.ensure(KEY, 0)
    for off in range(5):
        short.issue(KEY, q, off, 1_000, 1)
        short.write()
    assert short.changes_since(short.version - 2) is not None
    assert short.changes_since(short.version - 3) is None  # the oldest are gone
    short.replace_all(state.export())
    assert short.changes_since(short.version - 1) is None  # a whole copy came between
