"""The controller's fenced apply of a master's SyncStateSet proposal, checked over every
case of a small group."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import pytest

from capstan.controller.replica_info import ReplicaInfo
from capstan.controller.sync_state import AlterResult, apply_alter_sync_state_set

MASTER = 1


def subsets(ids: Iterable[int]) -> list[frozenset[int]]:
    pool = sorted(ids)
    return [frozenset(c) for n in range(len(pool) + 1) for c in itertools.combinations(pool, n)]


GROUP_IDS = frozenset({1, 2, 3})
CUR_MASTER_EPOCH = 4
CUR_SET_EPOCH = 7


def state(master: int | None, members: frozenset[int]) -> ReplicaInfo:
    return ReplicaInfo("broker-a", master, CUR_MASTER_EPOCH, members, CUR_SET_EPOCH, GROUP_IDS)


def alive_in(ids: frozenset[int]) -> Callable[[int], bool]:
    return ids.__contains__


# The refusals in the order they are checked: (why, the words the reason must contain).
RefusalCheck = Callable[[ReplicaInfo, int, int, int, frozenset[int], frozenset[int]], bool]
REFUSALS: list[tuple[RefusalCheck, str]] = [
    (lambda info, p, me, se, new, alive: p != info.master_id, "is not the master"),
    (lambda info, p, me, se, new, alive: me != info.master_epoch, "a deposed master is fenced"),
    (lambda info, p, me, se, new, alive: se != info.sync_state_set_epoch, "SyncStateSet epoch"),
    (lambda info, p, me, se, new, alive: info.master_id not in new, "lacks the master"),
    (lambda info, p, me, se, new, alive: not new <= info.replicas, "unregistered brokers"),
    (lambda info, p, me, se, new, alive: not new - info.sync_state_set <= alive, "not alive"),
]

ALTER_STATES = [state(MASTER, m | {MASTER}) for m in subsets({2, 3})] + [
    state(None, m) for m in subsets(GROUP_IDS)
]


def check_alter(
    info: ReplicaInfo, args: tuple[int, int, int, frozenset[int], frozenset[int]], got: AlterResult
) -> None:
    why = next((words for refused, words in REFUSALS if refused(info, *args)), None)
    assert got.accepted == (why is None)
    if why is not None:
        assert got.info is info  # a refusal changes nothing
        assert why in got.reason, (args, got.reason)
        return
    new_set = args[3]
    changed = new_set != info.sync_state_set
    assert got.info == ReplicaInfo(
        info.group,
        info.master_id,
        info.master_epoch,
        new_set,
        info.sync_state_set_epoch + changed,  # up exactly on a change
        info.replicas,
    )
    got.info.validate()


@pytest.mark.parametrize(
    "info", ALTER_STATES, ids=lambda i: f"{i.master_id}-{sorted(i.sync_state_set)}"
)
def test_every_proposal_against_every_state_is_applied_or_refused_for_the_first_reason(info):
    runs = 0
    for proposer, master_epoch, set_epoch, new_set, alive in itertools.product(
        (1, 2, 3),
        (CUR_MASTER_EPOCH - 1, CUR_MASTER_EPOCH, CUR_MASTER_EPOCH + 1),
        (CUR_SET_EPOCH - 1, CUR_SET_EPOCH),
        subsets({1, 2, 3, 4}),
        subsets({1, 2, 3, 4}),
    ):
        got = apply_alter_sync_state_set(
            info, proposer, master_epoch, set_epoch, new_set, alive_in(alive)
        )
        check_alter(info, (proposer, master_epoch, set_epoch, new_set, alive), got)
        runs += 1
    assert runs == 3 * 3 * 2 * 16 * 16


ALL_ALIVE = alive_in(frozenset({1, 2, 3, 4}))


@pytest.mark.parametrize(
    ("proposer", "master_epoch", "set_epoch", "new_set", "alive", "reason"),
    [
        (2, 4, 7, {1, 2}, ALL_ALIVE, "broker 2 is not the master of 'broker-a'; it is 1"),
        (
            1,
            3,
            7,
            {1, 2},
            ALL_ALIVE,
            "broker 1 proposes at master epoch 3 but the current one is 4:"
            " a deposed master is fenced",
        ),
        (
            1,
            4,
            6,
            {1, 2},
            ALL_ALIVE,
            "the proposal was built on SyncStateSet epoch 6 but the current one is 7;"
            " re-read the SyncStateSet and propose again",
        ),
        (1, 4, 7, {2, 3}, ALL_ALIVE, "the proposed SyncStateSet {2,3} lacks the master 1"),
        (
            1,
            4,
            7,
            {1, 4},
            ALL_ALIVE,
            "the proposed SyncStateSet {1,4} names unregistered brokers {4}",
        ),
        (
            1,
            4,
            7,
            {1, 2, 3},
            alive_in(frozenset({1, 2})),
            "brokers {3} would join the SyncStateSet but are not alive",
        ),
    ],
)
def test_each_refusal_says_why(proposer, master_epoch, set_epoch, new_set, alive, reason):
    info = state(1, frozenset({1, 2}))
    got = apply_alter_sync_state_set(
        info, proposer, master_epoch, set_epoch, frozenset(new_set), alive
    )
    assert got == AlterResult(False, info, reason)


def test_a_group_without_master_accepts_no_proposal():
    got = apply_alter_sync_state_set(
        state(None, frozenset({1})), 1, 4, 7, frozenset({1}), ALL_ALIVE
    )
    assert not got.accepted
    assert got.reason == "broker 1 is not the master of 'broker-a'; it has no master"


def test_an_accepted_change_bumps_the_set_epoch_and_a_dead_member_may_stay():
    info = state(1, frozenset({1, 2}))
    # 2 is dead but already a member: dropping it is the master's business, not a refusal.
    got = apply_alter_sync_state_set(
        info, 1, 4, 7, frozenset({1, 2, 3}), alive_in(frozenset({1, 3}))
    )
    assert got.accepted
    assert got.info == ReplicaInfo("broker-a", 1, 4, frozenset({1, 2, 3}), 8, GROUP_IDS)
    assert got.reason == "SyncStateSet {1,2} -> {1,2,3} at epoch 8"
    # The master re-reads epoch 8 and may shrink next.
    shrunk = apply_alter_sync_state_set(got.info, 1, 4, 8, frozenset({1}), ALL_ALIVE)
    assert shrunk.accepted and shrunk.info.sync_state_set_epoch == 9


def test_a_repeated_proposal_is_accepted_without_a_new_epoch():
    info = state(1, frozenset({1, 2}))
    got = apply_alter_sync_state_set(info, 1, 4, 7, frozenset({1, 2}), ALL_ALIVE)
    assert got == AlterResult(True, info, "the SyncStateSet is already {1,2}")
