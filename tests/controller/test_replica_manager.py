"""The controller's bookkeeping over a real state store: the first registered broker leads,
a silent master is replaced from the SyncStateSet with a higher epoch, a master restarted
holding less than its slave follows it, a deposed master's SyncStateSet proposals are
refused, a switchover, and state that outlives the controller."""

from __future__ import annotations

import pathlib

import pytest

from capstan.controller.broker_liveness import BrokerLiveness
from capstan.controller.replica_manager import ReplicaManager, UnknownBroker, UnknownGroup
from capstan.controller.state_store import FileStateStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def manager(path: pathlib.Path, clock: Clock, unclean: bool = False) -> ReplicaManager:
    return ReplicaManager(FileStateStore(path), BrokerLiveness(5.0, clock), unclean)


def test_brokers_get_stable_ids_and_the_first_one_leads(tmp_path, clock):
    m = manager(tmp_path, clock)
    id_a, view = m.register("g", "data-a", "127.0.0.1:1", 0, 0)
    assert id_a == 1 and view.info.master_id == 1 and view.info.master_epoch == 1
    assert view.master_address == "127.0.0.1:1"
    id_b, view = m.register("g", "data-b", "127.0.0.1:2", 0, 0)
    assert id_b == 2 and view.info.master_id == 1  # a live master stays
    assert view.info.sync_state_set == {1}  # b joins once it has caught up
    again, _ = m.register("g", "data-a", "127.0.0.1:9", 1, 0)  # restarted, new port
    assert again == 1
    assert m.view("g").master_address == "127.0.0.1:9"
    assert m.group_names() == ["g"]


def test_a_silent_master_is_replaced_from_the_sync_state_set(tmp_path, clock):
    m = manager(tmp_path, clock)
    m.register("g", "a", "h:1", 0, 0)
    m.register("g", "b", "h:2", 0, 0)
    m.register("g", "c", "h:3", 0, 0)
    info = m.view("g").info
    assert m.alter_sync_state_set(
        "g", 1, info.master_epoch, info.sync_state_set_epoch, frozenset({1, 2})
    ).accepted
    clock.now += 3
    m.heartbeat("g", 2, "h:2", 1, 500)
    m.heartbeat("g", 3, "h:3", 1, 900)  # further ahead, but not in the SyncStateSet
    assert m.check_masters() == []  # the master's last beat is 3 s old: alive
    clock.now += 3
    m.heartbeat("g", 2, "h:2", 1, 500)
    m.heartbeat("g", 3, "h:3", 1, 900)
    [election] = m.check_masters()
    assert election.master_id == 2
    assert election.info.master_epoch == 2 and election.info.sync_state_set == {2}
    view = m.view("g")
    assert [r.alive for r in view.replicas] == [False, True, True]
    assert view.master_address == "h:2"


class PausingStore(FileStateStore):
    """A state store whose read takes `pause_s` of the clock: the controller stopped (or the
    API server slow) in the middle of a master check."""

    def __init__(self, path: pathlib.Path, clock: Clock) -> None:
        super().__init__(path)
        self.clock = clock
        self.pause_s = 0.0

    def read(self):
        found = super().read()
        self.clock.now += self.pause_s
        return found


def test_a_controller_stopped_during_a_master_check_deposes_nobody(tmp_path, clock):
    store = PausingStore(tmp_path, clock)
    m = ReplicaManager(store, BrokerLiveness(5.0, clock), False)
    m.register("g", "a", "h:1", 0, 0)
    m.register("g", "b", "h:2", 0, 0)
    store.pause_s = 14.0  # the brokers kept beating; the controller heard nothing meanwhile
    assert m.check_masters() == []
    assert m.view("g").info.master_id == 1 and m.view("g").info.master_epoch == 1
    store.pause_s = 0.0
    assert m.check_masters() != []  # a master really silent that long is replaced next round


def pair_in_sync(m: ReplicaManager) -> None:
    """Brokers 1 (master) and 2 in the SyncStateSet, both at epoch 1 and offset 1000."""
    m.register("g", "a", "h:1", 0, 0, leading=False)
    m.register("g", "b", "h:2", 0, 0, leading=False)
    info = m.view("g").info
    m.alter_sync_state_set("g", 1, 1, info.sync_state_set_epoch, frozenset({1, 2}))
    m.heartbeat("g", 1, "h:1", 1, 1000, leading=True)
    m.heartbeat("g", 2, "h:2", 1, 1000, leading=False)


def test_a_master_restarted_holding_less_than_its_slave_follows_it(tmp_path, clock):
    m = manager(tmp_path, clock)
    pair_in_sync(m)
    m.heartbeat("g", 2, "h:2", 1, 1300, leading=False)  # copied a tail the master lost
    # A leading master is not compared, however far its slave's beat has gone.
    m.heartbeat("g", 1, "h:1", 1, 1000, leading=True)
    assert m.view("g").info.master_id == 1
    _, view = m.register("g", "a", "h:1", 1, 900, leading=False)  # restarted, short log
    assert view.info.master_id == 2 and view.info.master_epoch == 2
    assert view.info.sync_state_set == {2}
    assert view.master_address == "h:2"
    m.heartbeat("g", 1, "h:1", 1, 900, leading=False)  # now a slave: nothing to decide
    assert m.view("g").info == view.info


def test_every_change_of_master_is_counted_once_whatever_caused_it(tmp_path, clock):
    m = manager(tmp_path, clock)
    counted: list[str] = []
    m.on_election = counted.append
    pair_in_sync(m)  # the first master
    assert counted == ["g"]
    m.heartbeat("g", 2, "h:2", 1, 1300, leading=False)
    m.register("g", "a", "h:1", 1, 900, leading=False)  # a restarted master overtaken
    assert counted == ["g", "g"]
    m.heartbeat("g", 2, "h:2", 2, 1300, leading=True)
    m.heartbeat("g", 1, "h:1", 1, 900, leading=False)
    info = m.view("g").info
    m.alter_sync_state_set("g", 2, 2, info.sync_state_set_epoch, frozenset({1, 2}))
    assert m.elect("g", preferred=1)[0]  # a switchover
    assert m.check_masters() == []  # nothing to do: not counted
    assert counted == ["g", "g", "g"]


def test_a_master_restarted_with_its_slaves_log_or_more_leads_again(tmp_path, clock):
    m = manager(tmp_path, clock)
    pair_in_sync(m)
    before = m.view("g").info
    _, view = m.register("g", "a", "h:1", 1, 1000, leading=False)
    assert view.info == before  # no election: same master, same epoch
    view = m.heartbeat("g", 1, "h:1", 1, 1100, leading=False)
    assert view.info == before


def test_nobody_in_sync_alive_means_no_master_unless_unclean(tmp_path, clock):
    m = manager(tmp_path, clock)
    m.register("g", "a", "h:1", 0, 0)
    m.register("g", "b", "h:2", 0, 0)
    clock.now += 6
    m.heartbeat("g", 2, "h:2", 1, 100)
    [election] = m.check_masters()
    assert election.master_id is None and "unclean election disabled" in election.reason
    assert m.view("g").info.master_epoch == 2  # the old master is fenced anyway
    bold = manager(tmp_path, clock, unclean=True)
    bold.liveness = m.liveness
    [election] = bold.check_masters()
    assert election.master_id == 2 and "unclean" in election.reason


def test_a_deposed_master_cannot_change_the_sync_state_set(tmp_path, clock):
    m = manager(tmp_path, clock)
    m.register("g", "a", "h:1", 0, 0)
    m.register("g", "b", "h:2", 0, 0)
    old = m.view("g").info
    m.alter_sync_state_set("g", 1, old.master_epoch, old.sync_state_set_epoch, frozenset({1, 2}))
    _, switched = m.elect("g", preferred=2)
    assert switched.master_id == 2
    stale = m.alter_sync_state_set(
        "g", 1, old.master_epoch, old.sync_state_set_epoch + 1, frozenset({1, 2})
    )
    assert not stale.accepted and m.view("g").info.master_id == 2


def test_state_outlives_the_controller_but_liveness_starts_over(tmp_path, clock):
    m = manager(tmp_path, clock)
    m.register("g", "a", "h:1", 0, 0)
    m.register("g", "b", "h:2", 0, 0)
    restarted = manager(tmp_path, clock)
    view = restarted.view("g")
    assert view.info.master_id == 1 and view.info.replicas == {1, 2}
    assert [r.seconds_since_heartbeat for r in view.replicas] == [-1.0, -1.0]
    assert [r.address for r in view.replicas] == ["h:1", "h:2"]  # from the stored registration


def test_unknown_groups_and_brokers_are_refused(tmp_path, clock):
    m = manager(tmp_path, clock)
    with pytest.raises(UnknownGroup):
        m.view("nope")
    with pytest.raises(UnknownGroup):
        m.elect("nope")
    m.register("g", "a", "h:1", 0, 0)
    with pytest.raises(UnknownBroker):
        m.heartbeat("g", 7, "h:7", 0, 0)


def test_a_master_not_heard_from_since_the_controller_started_is_judged_only_when_told(
    tmp_path, clock
):
    first = manager(tmp_path, clock)
    pair_in_sync(first)
    before = first.view("g").info
    # A new controller on the same state: it has heard from nobody yet.
    fresh = manager(tmp_path, clock)
    clock.now += 60
    assert fresh.check_masters(judge_unheard=False) == []
    assert fresh.view("g").info == before
    [election] = fresh.check_masters(judge_unheard=True)
    assert election.master_id is None and election.info.master_epoch == before.master_epoch + 1


def test_a_master_not_heard_from_is_replaced_once_its_slave_has_beaten_a_whole_timeout(
    tmp_path, clock
):
    first = manager(tmp_path, clock)
    pair_in_sync(first)
    fresh = manager(tmp_path, clock)  # a new controller; the master never finds it
    fresh.heartbeat("g", 2, "h:2", 1, 1000, leading=False)
    clock.now += 3
    fresh.heartbeat("g", 2, "h:2", 1, 1000, leading=False)
    assert fresh.check_masters(judge_unheard=False) == []  # the slave is 3 s in: wait
    clock.now += 3
    fresh.heartbeat("g", 2, "h:2", 1, 1000, leading=False)
    [election] = fresh.check_masters(judge_unheard=False)
    assert election.master_id == 2
