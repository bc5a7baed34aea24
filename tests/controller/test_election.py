"""Master election: every configuration of a three-replica group keeps the invariants that
make a failover lose no confirmed message (a master that restarted holding less than a
SyncStateSet member among them), and the persisted state round-trips intact."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable

import pytest

from capstan.controller.election import Candidate, Election, elect_master
from capstan.controller.replica_info import ReplicaInfo, format_ids

IDS = (1, 2, 3)
REPLICAS = frozenset(IDS)
MASTER_EPOCH = 4  # arbitrary non-zero epochs, so "bumped by one" cannot pass by accident
SET_EPOCH = 7


def subsets(ids: Iterable[int]) -> list[frozenset[int]]:
    pool = sorted(ids)
    return [frozenset(c) for n in range(len(pool) + 1) for c in itertools.combinations(pool, n)]


GroupState = tuple[int | None, frozenset[int], int]  # master, SyncStateSet, master epoch


def group_states() -> list[GroupState]:
    """Every state a valid group can be in: the SyncStateSet holds the master, if any; a group
    without one either never had one (master epoch 0) or lost it."""
    states: list[GroupState] = [(None, s, e) for e in (0, MASTER_EPOCH) for s in subsets(IDS)]
    states += [(m, s, MASTER_EPOCH) for m in IDS for s in subsets(IDS) if m in s]
    return states


def all_candidates() -> list[dict[int, Candidate]]:
    """Every alive subset x every epoch in {1,2} x every offset in {0,100}, per replica."""
    per_replica = [
        [Candidate(i, *state) for state in itertools.product((False, True), (1, 2), (0, 100))]
        for i in IDS
    ]
    return [{c.broker_id: c for c in combo} for combo in itertools.product(*per_replica)]


CANDIDATES = all_candidates()
GROUP_STATES = group_states()
PREFERRED = (None, 1, 2, 3)


def info_of(master: int | None, sync: frozenset[int], epoch: int = MASTER_EPOCH) -> ReplicaInfo:
    return ReplicaInfo("broker-a", master, epoch, sync, SET_EPOCH, REPLICAS)


def rank(c: Candidate) -> tuple[int, int, int]:
    return (c.epoch, c.max_offset, -c.broker_id)


def clean_pool(info: ReplicaInfo) -> frozenset[int]:
    """Who holds every confirmed message: before the first master nothing was confirmed."""
    never_led = info.master_id is None and info.master_epoch == 0
    return info.replicas if never_led else info.sync_state_set


def eligible(info: ReplicaInfo, cands: dict[int, Candidate], unclean: bool) -> list[Candidate]:
    """Who may lead a group without a live master, restated from the rules."""
    in_sync = [c for c in cands.values() if c.alive and c.broker_id in clean_pool(info)]
    if in_sync or not unclean:
        return in_sync
    return [c for c in cands.values() if c.alive and c.broker_id in info.replicas]


def check_bookkeeping(info: ReplicaInfo, result: Election) -> None:
    new = result.info
    new.validate()
    assert result.master_id == new.master_id
    assert result.reason
    assert (new.group, new.replicas) == (info.group, info.replicas)
    changed = new.master_id != info.master_id
    elected = changed and new.master_id is not None
    assert new.master_epoch == info.master_epoch + changed  # never down; up on every change
    assert new.sync_state_set_epoch == info.sync_state_set_epoch + elected
    expected_set = frozenset({new.master_id}) if elected else info.sync_state_set
    assert new.sync_state_set == expected_set


def ahead_of_master(info: ReplicaInfo, cands: dict[int, Candidate]) -> list[Candidate]:
    """Live SyncStateSet members holding more history than the master, restated."""
    assert info.master_id is not None
    master = rank(cands[info.master_id])[:2]
    return [
        c
        for c in cands.values()
        if c.alive and c.broker_id in info.sync_state_set and rank(c)[:2] > master
    ]


def check_choice(
    info: ReplicaInfo,
    cands: dict[int, Candidate],
    preferred: int | None,
    unclean: bool,
    master_leading: bool,
    result: Election,
) -> None:
    new = result.info
    master_alive = info.master_id is not None and cands[info.master_id].alive
    if preferred is not None:
        may_lead = cands[preferred].alive and (unclean or preferred in clean_pool(info))
        assert new.master_id == (preferred if may_lead else info.master_id)
        if not may_lead:
            assert new == info  # a refused switchover changes nothing
        return
    if master_alive:
        ahead = [] if master_leading else ahead_of_master(info, cands)
        if not ahead:
            assert new == info  # a live master is never replaced unasked
            return
        # A restarted master holding less gives way to the member holding the most, which
        # holds everything it does (the same history, further on).
        assert new.master_id is not None and cands[new.master_id] in ahead
        assert rank(cands[new.master_id]) == max(rank(c) for c in ahead)
        return
    pool = eligible(info, cands, unclean)
    if not pool:
        assert new.master_id is None  # nobody may lead: no master, never a guess
        return
    winner = cands[new.master_id] if new.master_id is not None else None
    assert winner is not None and winner.alive
    assert unclean or winner.broker_id in clean_pool(info)
    assert rank(winner) == max(rank(c) for c in pool)


@pytest.mark.parametrize(("master", "sync", "epoch"), GROUP_STATES, ids=str)
def test_every_configuration_of_three_replicas_keeps_the_invariants(master, sync, epoch):
    info = info_of(master, sync, epoch)
    info.validate()
    runs = 0
    flags = (False, True)
    for cands, preferred, unclean, leading in itertools.product(
        CANDIDATES, PREFERRED, flags, flags
    ):
        result = elect_master(
            info, cands, preferred=preferred, unclean=unclean, master_leading=leading
        )
        check_bookkeeping(info, result)
        check_choice(info, cands, preferred, unclean, leading, result)
        runs += 1
    # alive x epoch x offset per replica, preferred, unclean, whether the master leads
    assert runs == 8**3 * 4 * 2 * 2


def test_the_exhaustive_space_is_what_the_docstring_claims():
    assert len(GROUP_STATES) == 2 * 8 + 3 * 4  # fresh or masterless: any set; 4 per master
    assert len(CANDIDATES) == 8**3
    assert len(GROUP_STATES) * len(CANDIDATES) * len(PREFERRED) * 2 * 2 == 229_376


# ---- readable examples --------------------------------------------------------------------


def cand(broker_id: int, *, alive: bool = True, epoch: int = 1, offset: int = 0) -> Candidate:
    return Candidate(broker_id, alive, epoch, offset)


def heartbeats(*cands: Candidate) -> dict[int, Candidate]:
    return {c.broker_id: c for c in cands}


def test_a_fresh_group_with_nobody_alive_stays_without_master_and_without_new_epochs():
    fresh = ReplicaInfo("broker-a")
    assert (fresh.master_id, fresh.master_epoch, fresh.sync_state_set_epoch) == (None, 0, 0)
    assert fresh.sync_state_set == fresh.replicas == frozenset()
    result = elect_master(fresh, {})
    assert result == Election(None, fresh, result.reason)
    assert "no master" in result.reason


def test_the_first_master_of_a_fresh_group_is_elected_cleanly_from_the_registered_replicas():
    fresh = ReplicaInfo("broker-a", replicas=frozenset({1, 2}))
    result = elect_master(fresh, heartbeats(cand(1, offset=0), cand(2, offset=100)))
    assert result.info == ReplicaInfo("broker-a", 2, 1, frozenset({2}), 1, frozenset({1, 2}))
    assert result.reason == (
        "elected broker 2 (epoch 1, offset 100) from the replicas {1,2} (first master of the group)"
    )
    # Once it has had a master, the group elects from its SyncStateSet only.
    deposed = elect_master(result.info, heartbeats(cand(1, offset=100)))
    assert deposed.master_id is None and deposed.info.master_epoch == 2


def test_a_dead_master_is_replaced_by_the_sync_member_with_the_most_history():
    info = info_of(1, frozenset({1, 2, 3}))
    cands = heartbeats(
        cand(1, alive=False, epoch=2, offset=900),
        cand(2, epoch=2, offset=100),
        cand(3, epoch=2, offset=300),
    )
    result = elect_master(info, cands)
    assert result.master_id == 3
    assert result.info == ReplicaInfo("broker-a", 3, 5, frozenset({3}), 8, REPLICAS)
    assert "elected broker 3 (epoch 2, offset 300) from the SyncStateSet {1,2,3}" in result.reason


def test_a_higher_epoch_beats_a_longer_log_and_ties_go_to_the_smallest_id():
    info = info_of(None, frozenset({1, 2, 3}))
    # 3's extra offsets were written under an older master and may be a divergent tail.
    longer = heartbeats(cand(1, epoch=2, offset=100), cand(3, epoch=1, offset=500))
    assert elect_master(info, longer).master_id == 1
    tied = heartbeats(cand(3, epoch=2, offset=100), cand(2, epoch=2, offset=100))
    assert elect_master(info, tied).master_id == 2


def test_no_live_sync_member_leaves_the_group_without_master_and_fences_the_old_one():
    info = info_of(1, frozenset({1, 2}))
    cands = heartbeats(cand(1, alive=False), cand(2, alive=False), cand(3, offset=100))
    result = elect_master(info, cands)
    assert result.master_id is None
    assert result.info == ReplicaInfo("broker-a", None, 5, frozenset({1, 2}), 7, REPLICAS)
    assert result.reason.startswith(
        "no live replica in the SyncStateSet {1,2}; unclean election disabled"
    )
    # Nobody new to fence the second time round: the epoch stays.
    again = elect_master(result.info, cands)
    assert again.info == result.info


def test_unclean_election_takes_an_out_of_sync_replica_and_says_what_it_costs():
    info = info_of(1, frozenset({1, 2}))
    cands = heartbeats(cand(1, alive=False), cand(2, alive=False), cand(3, offset=100))
    result = elect_master(info, cands, unclean=True)
    assert result.master_id == 3
    assert "unclean" in result.reason and "lost" in result.reason


def test_a_returning_member_of_the_set_leads_a_masterless_group():
    masterless = ReplicaInfo("broker-a", None, 5, frozenset({1, 2}), 7, REPLICAS)
    cands = heartbeats(cand(1, epoch=4, offset=100), cand(3, epoch=4, offset=900))
    result = elect_master(masterless, cands)
    assert result.master_id == 1  # 3 holds more, but not provably what was confirmed
    assert result.info.master_epoch == 6


def test_a_replica_without_heartbeat_counts_as_dead_and_strangers_are_ignored():
    info = info_of(1, frozenset({1, 2}))
    stranger = heartbeats(cand(9, epoch=9, offset=999))  # never registered in this group
    assert elect_master(info, stranger).master_id is None
    assert elect_master(info, stranger, unclean=True).master_id is None
    assert elect_master(info, stranger, preferred=9).info == info


def test_a_switchover_to_a_live_sync_member():
    info = info_of(1, frozenset({1, 2}))
    cands = heartbeats(cand(1), cand(2), cand(3))
    result = elect_master(info, cands, preferred=2)
    assert result.info == ReplicaInfo("broker-a", 2, 5, frozenset({2}), 8, REPLICAS)
    assert result.reason == "switched the master from 1 to the preferred broker 2"


def test_a_master_restarted_behind_a_sync_member_gives_way_to_it():
    info = info_of(1, frozenset({1, 2, 3}))
    cands = heartbeats(cand(1, offset=900), cand(2, offset=1200), cand(3, offset=1000))
    result = elect_master(info, cands, master_leading=False)
    assert result.info == ReplicaInfo("broker-a", 2, 5, frozenset({2}), 8, REPLICAS)
    assert result.reason == (
        "master broker 1 (epoch 1, offset 900) restarted holding less than broker 2"
        " (epoch 1, offset 1200); elected 2 from the SyncStateSet {1,2,3},"
        " 1 follows it and copies what it lost"
    )
    # A leading master is never compared: the slaves' beats may be fresher than its own.
    assert elect_master(info, cands).info == info


def test_a_restarted_master_holding_as_much_or_more_leads_again_without_an_election():
    info = info_of(1, frozenset({1, 2}))
    for offset in (1200, 1500):  # the same log as the slave's, or an unacknowledged tail
        cands = heartbeats(cand(1, offset=offset), cand(2, offset=1200))
        result = elect_master(info, cands, master_leading=False)
        assert result == Election(1, info, "master 1 is alive")


@pytest.mark.parametrize(
    ("others", "why"),
    [
        ((cand(2, alive=False, offset=1200),), "the member ahead is dead"),
        ((cand(3, offset=1200),), "the replica ahead is outside the SyncStateSet"),
        ((cand(2, epoch=1, offset=5000),), "an older epoch, however long"),
    ],
)
def test_a_restarted_master_leads_again_when_no_live_sync_member_is_ahead(others, why):
    info = info_of(1, frozenset({1, 2}))
    cands = heartbeats(cand(1, epoch=2, offset=900), *others)
    assert elect_master(info, cands, master_leading=False).info == info, why


@pytest.mark.parametrize(
    ("preferred", "alive", "unclean", "reason"),
    [
        (4, {1, 2, 3}, False, "preferred broker 4 is not a registered replica of 'broker-a'"),
        (2, {1, 3}, False, "preferred broker 2 is not alive"),
        (2, {1, 3}, True, "preferred broker 2 is not alive"),
        (1, {1, 2, 3}, False, "preferred broker 1 is already the master"),
        (
            3,
            {1, 2, 3},
            False,
            "preferred broker 3 is not in the SyncStateSet {1,2}; unclean election disabled",
        ),
    ],
)
def test_a_refused_switchover_changes_nothing_and_says_why(preferred, alive, unclean, reason):
    info = ReplicaInfo("broker-a", 1, 4, frozenset({1, 2}), 7, REPLICAS)
    cands = heartbeats(*(cand(i, alive=i in alive) for i in (1, 2, 3)))
    result = elect_master(info, cands, preferred=preferred, unclean=unclean)
    assert result == Election(1, info, reason)


def test_an_unclean_switchover_is_allowed_and_flagged():
    info = info_of(1, frozenset({1, 2}))
    result = elect_master(info, heartbeats(cand(1), cand(3)), preferred=3, unclean=True)
    assert result.master_id == 3
    assert "unclean" in result.reason


def test_a_candidate_filed_under_another_id_is_a_bug():
    with pytest.raises(ValueError, match="filed under broker id 2"):
        elect_master(info_of(None, frozenset()), {2: cand(1)})


# ---- ReplicaInfo: invariants and the persisted document ----------------------------------


def test_the_document_sorts_ids_and_round_trips_through_json():
    info = ReplicaInfo("broker-a", 3, 2, frozenset({3, 1}), 5, frozenset({3, 2, 1}))
    doc = info.to_json()
    assert doc == {
        "group": "broker-a",
        "master_id": 3,
        "master_epoch": 2,
        "sync_state_set": [1, 3],
        "sync_state_set_epoch": 5,
        "replicas": [1, 2, 3],
    }
    assert ReplicaInfo.from_json(json.loads(json.dumps(doc))) == info
    fresh = ReplicaInfo("broker-b")
    assert ReplicaInfo.from_json(fresh.to_json()) == fresh


@pytest.mark.parametrize(("master", "sync", "epoch"), GROUP_STATES, ids=str)
def test_every_valid_state_round_trips(master, sync, epoch):
    info = info_of(master, sync, epoch)
    assert ReplicaInfo.from_json(json.loads(json.dumps(info.to_json()))) == info


@pytest.mark.parametrize(
    ("info", "problem"),
    [
        (ReplicaInfo("g", 1, 0, frozenset({2}), 0, frozenset({1, 2})), "master 1 is not in"),
        (ReplicaInfo("g", None, 0, frozenset({2}), 0, frozenset({1})), "{2} are not registered"),
        (ReplicaInfo("g", None, -1), "master_epoch -1 is negative"),
        (ReplicaInfo("g", None, 0, frozenset(), -2), "sync_state_set_epoch -2 is negative"),
        (ReplicaInfo("g", 0, 0, frozenset({0}), 0, frozenset({0})), "must be positive, not {0}"),
    ],
)
def test_validate_names_each_broken_invariant(info, problem):
    assert any(problem in v for v in info.violations())
    with pytest.raises(ValueError, match="replica info of 'g'"):
        info.validate()


def doc_with(**changes: object) -> dict[str, object]:
    doc = ReplicaInfo("g", 1, 1, frozenset({1}), 1, frozenset({1, 2})).to_json()
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "must be a JSON object, not list"),
        ({k: v for k, v in doc_with().items() if k != "replicas"}, "lacks 'replicas'"),
        (doc_with(extra=1), "unknown key 'extra'"),
        (doc_with(group=""), "'group' must be a non-empty string"),
        (doc_with(group=7), "'group' must be a non-empty string"),
        (doc_with(master_id="1"), "'master_id' must be an integer"),
        (doc_with(master_id=True), "'master_id' must be an integer"),
        (doc_with(master_epoch=1.5), "'master_epoch' must be an integer"),
        (doc_with(sync_state_set_epoch=None), "'sync_state_set_epoch' must be an integer"),
        (doc_with(replicas="1,2"), "'replicas' must be a list of broker ids"),
        (doc_with(replicas=[1, "2"]), "an id in replica info field 'replicas'"),
        (doc_with(replicas=[1, 2, 2]), "'replicas' repeats a broker id"),
        (doc_with(sync_state_set=[2]), "master 1 is not in the SyncStateSet"),
        (doc_with(master_epoch=-1), "master_epoch -1 is negative"),
    ],
)
def test_a_malformed_document_is_refused_with_a_clear_message(doc, message):
    with pytest.raises(ValueError) as raised:
        ReplicaInfo.from_json(doc)
    assert message in str(raised.value)


def test_format_ids_sorts():
    assert format_ids({3, 1, 2}) == "{1,2,3}"
    assert format_ids(()) == "{}"


# ---- groups acknowledging by quorum ------------------------------------------------------


def _acknowledged(master_end: int, slave_ends: Iterable[int], quorum: int) -> int:
    """The end of what a master acknowledged with `quorum` copies, its own among them."""
    return sorted([master_end, *slave_ends], reverse=True)[quorum - 1]


@pytest.mark.parametrize(("members", "quorum"), [(3, 2), (4, 2), (4, 3), (5, 3)])
def test_by_quorum_a_dead_master_is_replaced_only_by_a_member_holding_every_ack(
    members: int, quorum: int
) -> None:
    """Every spread of the slaves' logs and every set of members that stopped copying: the
    dead master is first deposed; a member is elected only once enough of them reported,
    and the one elected holds every write the master acknowledged."""
    ids = tuple(range(1, members + 1))
    sync = frozenset(ids)
    info = ReplicaInfo("broker-a", 1, MASTER_EPOCH, sync, SET_EPOCH, sync)
    required = members - quorum + 1
    for ends in itertools.product((0, 50, 100), repeat=members - 1):
        acked = _acknowledged(100, ends, quorum)
        for reported in subsets(ids[1:]):
            first = elect_master(
                info,
                {i: Candidate(i, i != 1, 1, ([100, *ends])[i - 1]) for i in ids},
                ack_quorum=quorum,
            )
            assert first.master_id is None and first.info.master_epoch == MASTER_EPOCH + 1
            candidates = {
                i: Candidate(
                    i,
                    i != 1,
                    1,
                    ([100, *ends])[i - 1],
                    first.info.master_epoch if i in reported else 0,
                )
                for i in ids
            }
            second = elect_master(first.info, candidates, ack_quorum=quorum)
            if len(reported) < required:
                assert second.master_id is None and second.info == first.info, second.reason
                continue
            assert second.master_id in reported, second.reason
            assert candidates[second.master_id].max_offset >= acked, (ends, reported)
            assert second.info.master_epoch == MASTER_EPOCH + 2


def test_by_quorum_reports_from_an_older_epoch_do_not_count() -> None:
    """A member that stopped copying under an earlier epoch may have copied since."""
    sync = frozenset(IDS)
    info = ReplicaInfo("broker-a", None, MASTER_EPOCH, sync, SET_EPOCH, REPLICAS)
    stale = {i: Candidate(i, i != 1, 1, 100, MASTER_EPOCH - 1) for i in IDS}
    assert elect_master(info, stale, ack_quorum=2).master_id is None
    fresh = {i: Candidate(i, i != 1, 1, 100, MASTER_EPOCH) for i in IDS}
    assert elect_master(info, fresh, ack_quorum=2).master_id == 2


def test_a_quorum_as_large_as_the_set_elects_as_all_ack_does() -> None:
    """Two members and a quorum of two: each holds every acknowledged write; no wait."""
    sync = frozenset({1, 2})
    info = ReplicaInfo("broker-a", 1, MASTER_EPOCH, sync, SET_EPOCH, REPLICAS)
    candidates = {i: Candidate(i, i != 1, 1, 100) for i in IDS}
    assert elect_master(info, candidates, ack_quorum=2).master_id == 2
