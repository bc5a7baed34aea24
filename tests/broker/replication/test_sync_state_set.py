"""The master's SyncStateSet proposal and the confirm offset, each checked over every case
of a small group."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest

from capstan.broker.replication.sync_state_set import (
    SlaveProgress,
    confirm_offset,
    propose_sync_state_set,
)

MASTER = 1
SLAVES = (2, 3, 4)
NOW_S = 100.0
MAX_LAG_S = 10.0
DEADLINE_S = NOW_S - MAX_LAG_S  # caught up at exactly the deadline still counts
CONFIRM = 50
MASTER_EPOCH = 2


def subsets(ids: Iterable[int]) -> list[frozenset[int]]:
    pool = sorted(ids)
    return [frozenset(c) for n in range(len(pool) + 1) for c in itertools.combinations(pool, n)]


# ---- propose_sync_state_set ---------------------------------------------------------------

# Per slave: disconnected, or acked just below / at the confirm offset, caught up before / at /
# after the deadline, on an old or the master's epoch.
SLAVE_STATES: list[SlaveProgress | None] = [
    None,
    *(
        SlaveProgress(acked, caught_up, epoch)
        for acked in (CONFIRM - 1, CONFIRM)
        for caught_up in (DEADLINE_S - 0.5, DEADLINE_S, DEADLINE_S + 5)
        for epoch in (MASTER_EPOCH - 1, MASTER_EPOCH)
    ),
]


def keeps_up(progress: SlaveProgress | None) -> bool:
    return progress is not None and progress.last_caught_up_s >= DEADLINE_S


def may_join(progress: SlaveProgress | None) -> bool:
    return (
        keeps_up(progress)
        and progress is not None
        and progress.acked_offset >= CONFIRM
        and progress.epoch == MASTER_EPOCH
    )


def check_proposal(
    current: frozenset[int], slaves: dict[int, SlaveProgress], got: frozenset[int] | None
) -> None:
    final = current if got is None else got
    assert got != current  # None, never an unchanged copy
    assert MASTER in final  # the master always stays
    for slave in SLAVES:
        progress = slaves.get(slave)
        if slave in current:
            # a member stays exactly as long as it keeps up and stays connected
            assert (slave in final) == keeps_up(progress), (slave, progress)
        else:
            # a slave joins exactly when it is caught up, on the master's epoch and not lagging
            assert (slave in final) == may_join(progress), (slave, progress)
    assert final <= current | set(slaves) | {MASTER}  # nothing else changes


@pytest.mark.parametrize("master_listed", [True, False], ids=["master-in-set", "master-missing"])
def test_every_shrink_and_expand_case_of_three_slaves(master_listed):
    runs = 0
    for members, states in itertools.product(
        subsets(SLAVES), itertools.product(SLAVE_STATES, repeat=3)
    ):
        current = members | {MASTER} if master_listed else members
        slaves = {s: p for s, p in zip(SLAVES, states, strict=True) if p is not None}
        got = propose_sync_state_set(
            current, MASTER, slaves, CONFIRM, NOW_S, MAX_LAG_S, MASTER_EPOCH
        )
        check_proposal(current, slaves, got)
        runs += 1
    assert runs == 8 * 13**3


def test_a_lagging_member_is_dropped_and_a_caught_up_slave_joins():
    slaves = {
        2: SlaveProgress(acked_offset=500, last_caught_up_s=80.0, epoch=2),  # behind 20 s
        3: SlaveProgress(acked_offset=900, last_caught_up_s=99.0, epoch=2),  # caught up
    }
    got = propose_sync_state_set(frozenset({1, 2}), 1, slaves, 500, 100.0, 10.0, 2)
    assert got == frozenset({1, 3})


def test_a_disconnected_member_is_dropped_and_the_master_is_never():
    got = propose_sync_state_set(frozenset({1, 2, 3}), 1, {}, 0, 100.0, 10.0, 2)
    assert got == frozenset({1})
    assert propose_sync_state_set(frozenset({1}), 1, {}, 0, 100.0, 10.0, 2) is None


def test_a_slave_on_an_old_epoch_does_not_join_however_far_it_got():
    # It may still hold a divergent tail from the old master, not yet truncated.
    slaves = {2: SlaveProgress(acked_offset=10_000, last_caught_up_s=100.0, epoch=1)}
    assert propose_sync_state_set(frozenset({1}), 1, slaves, 500, 100.0, 10.0, 2) is None


def test_the_masters_own_progress_entry_changes_nothing():
    slaves = {1: SlaveProgress(acked_offset=0, last_caught_up_s=0.0, epoch=0)}
    assert propose_sync_state_set(frozenset({1}), 1, slaves, 500, 100.0, 10.0, 2) is None


# ---- confirm_offset -----------------------------------------------------------------------

MISSING = None
ACKS = (MISSING, 0, 50, 100, 150)


def acks_of(values: tuple[int | None, ...]) -> dict[int, int]:
    return {i: v for i, v in zip((1, 2, 3, 4), values, strict=True) if v is not None}


@pytest.mark.parametrize("master_offset", [0, 100, 120])
def test_confirm_offset_is_the_least_every_member_holds(master_offset):
    runs = 0
    for members, values in itertools.product(
        subsets({1, 2, 3, 4}), itertools.product(ACKS, repeat=4)
    ):
        acked = acks_of(values)
        got = confirm_offset(master_offset, members, MASTER, acked)
        held = [master_offset] + [acked.get(m, 0) for m in members if m != MASTER]
        assert got <= master_offset
        assert all(got <= h for h in held)  # nobody is asked for what it lacks
        assert got in held  # and nothing less than necessary is confirmed
        for raised in members - {MASTER}:
            more = {**acked, raised: acked.get(raised, 0) + 50}
            assert confirm_offset(master_offset, members, MASTER, more) >= got  # monotone
        runs += 1
    assert runs == 16 * 5**4


def test_confirm_offset_examples():
    assert confirm_offset(900, frozenset({1}), 1, {}) == 900  # alone, the master confirms all
    assert confirm_offset(900, frozenset({1, 2}), 1, {2: 400}) == 400
    assert confirm_offset(900, frozenset({1, 2, 3}), 1, {2: 400}) == 0  # 3 acked nothing yet
    assert confirm_offset(900, frozenset({1, 2}), 1, {1: 5, 2: 950, 3: 1}) == 900
