"""What a master's Metadata carries of the pop state: whole on a new stream, then the
journal lines written since the copy before, whole again when those are gone; and a slave
that must not apply changes (it skipped some) drops them until the whole comes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capstan.broker.pop import pop_state
from capstan.broker.pop.pop_state import PopState
from capstan.broker.replication.state_copy import BrokerStateCopy, StatePart

KEY = ("G", "T", 0)


class Key:
    key = b"k" * 32

    def adopt_key(self, key: bytes) -> None:
        self.key = key


def copy_of(state: PopState) -> BrokerStateCopy:
    part = StatePart(
        "pop_state_json",
        lambda: state.version,
        state.export,
        state.replace_all,
        on_loop=True,
        changes_since=state.changes_since,
        changes_field="pop_state_lines",
        adopt_changes=state.apply_changes,
    )
    return BrokerStateCopy([part], Key())


def apply(copy: BrokerStateCopy, metadata: object) -> None:
    copy.apply_files(metadata)  # type: ignore[arg-type]
    copy.apply_services(metadata)  # type: ignore[arg-type]


def hand_out(state: PopState, offsets: range) -> None:
    q = state.ensure(KEY, 0)
    for offset in offsets:
        state.issue(KEY, q, offset, 60_000, 1)
    state.advance(KEY, q, offsets.stop)
    state.write()


def test_a_stream_sends_the_pop_state_whole_then_as_lines(tmp_path: Path):
    master, slave = PopState(tmp_path / "m", 1 << 30), PopState(tmp_path / "s", 1 << 30)
    at_master, at_slave = copy_of(master), copy_of(slave)
    hand_out(master, range(3))
    first = at_master.metadata(None, at_master.versions())
    assert first.pop_state_json and not first.pop_state_lines and first.handle_key
    assert at_slave.holds_whole(first)
    apply(at_slave, first)
    sent = at_master.versions()
    hand_out(master, range(3, 5))
    master.done(KEY, master.queues[KEY], 1)
    master.write()
    later = at_master.metadata(sent, at_master.versions())
    assert later.pop_state_lines and not later.pop_state_json and not at_slave.holds_whole(later)
    assert not at_slave.writes_files(later)  # applied on the loop, no thread needed
    apply(at_slave, later)
    assert slave.export()["queues"] == master.export()["queues"]
    assert sorted(slave.queues[KEY].inflight) == [0, 2, 3, 4]


def test_changes_older_than_the_kept_lines_go_whole(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(pop_state, "CHANGES_KEPT", 2)
    master = PopState(tmp_path / "m", 1 << 30)
    at_master = copy_of(master)
    sent = at_master.versions()
    for n in range(4):
        hand_out(master, range(n, n + 1))
    metadata = at_master.metadata(sent, at_master.versions())
    assert metadata.pop_state_json and not metadata.pop_state_lines
    assert len(json.loads(metadata.pop_state_json)["queues"][0]["inflight"]) == 4


def test_a_slave_that_skipped_metadata_drops_changes_until_the_whole_comes(tmp_path: Path):
    master, slave = PopState(tmp_path / "m", 1 << 30), PopState(tmp_path / "s", 1 << 30)
    at_master, at_slave = copy_of(master), copy_of(slave)
    apply(at_slave, at_master.metadata(None, at_master.versions()))
    sent = at_master.versions()
    hand_out(master, range(2))  # a change the slave skipped (slave_stream: acted state)
    skipped = at_master.metadata(sent, at_master.versions())
    sent = at_master.versions()
    hand_out(master, range(2, 3))
    changes = at_master.metadata(sent, at_master.versions())
    at_slave.drop_changes(changes)  # what the slave does while it wants the whole
    apply(at_slave, changes)
    assert KEY not in slave.queues
    assert skipped.pop_state_lines  # (never applied)
    whole = at_master.metadata(None, at_master.versions())  # what whole_state_wanted brings
    apply(at_slave, whole)
    assert sorted(slave.queues[KEY].inflight) == [0, 1, 2]


@pytest.mark.parametrize("line", ["X G T 0 1", "P G T", ""])
def test_an_unreadable_line_from_the_master_is_skipped(tmp_path: Path, line: str):
    slave = PopState(tmp_path / "s", 1 << 30)
    slave.apply_changes(f"{line}\nN G T 0 7\n")
    assert slave.queues[KEY].next_offset == 7
