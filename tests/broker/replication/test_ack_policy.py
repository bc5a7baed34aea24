"""Write acknowledgement: how many copies a write needs, and when it has them.

The decision space is small, so most tests walk all of it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from capstan.broker.replication.ack_policy import (
    HA_MAX_GAP_NOT_IN_SYNC_BYTES,
    AckOutcome,
    AckSettings,
    acks_reached,
    in_sync_count,
    need_ack_nums,
    quorum_offset,
)

REFUSED = AckOutcome.IN_SYNC_REPLICAS_NOT_ENOUGH
MASTER = 0
SLAVES = (1, 2, 3)


def all_settings() -> Iterator[AckSettings]:
    for isr in range(1, 5):
        for minimum, all_ack, auto in itertools.product(
            range(1, isr + 1), (False, True), (False, True)
        ):
            yield AckSettings(isr, minimum, all_ack, auto, 1024)


def all_situations() -> Iterator[tuple[int, int, int, bool]]:
    """(sync_state_set_size, in_sync_count, alive_replicas, slave_acting_master)."""
    return itertools.product(range(1, 5), range(1, 5), range(5), (False, True))


def decide(settings: AckSettings, sss: int, in_sync: int, alive: int, acting: bool) -> object:
    return need_ack_nums(
        settings,
        sync_state_set_size=sss,
        in_sync_count=in_sync,
        alive_replicas=alive,
        slave_acting_master=acting,
    )


# -- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        (1, AckSettings(1, 1, False, False, HA_MAX_GAP_NOT_IN_SYNC_BYTES)),
        (2, AckSettings(2, 1, True, False, HA_MAX_GAP_NOT_IN_SYNC_BYTES)),
        (3, AckSettings(3, 2, True, False, HA_MAX_GAP_NOT_IN_SYNC_BYTES)),
        (4, AckSettings(4, 3, True, False, HA_MAX_GAP_NOT_IN_SYNC_BYTES)),
        (5, AckSettings(5, 3, True, False, HA_MAX_GAP_NOT_IN_SYNC_BYTES)),
    ],
)
def test_safe_defaults(replicas: int, expected: AckSettings) -> None:
    assert AckSettings.safe_defaults(replicas) == expected


@pytest.mark.parametrize("replicas", range(1, 6))
def test_safe_defaults_need_every_broker_when_all_are_in_sync(replicas: int) -> None:
    settings = AckSettings.safe_defaults(replicas)
    assert decide(settings, replicas, replicas, replicas, False) == replicas


@pytest.mark.parametrize("replicas", range(3, 6))
def test_safe_defaults_refuse_below_a_majority(replicas: int) -> None:
    settings = AckSettings.safe_defaults(replicas)
    majority = replicas // 2 + 1
    assert decide(settings, majority - 1, majority - 1, replicas, False) is REFUSED
    assert decide(settings, majority, majority, replicas, False) == majority


def test_safe_defaults_refuse_no_replicas() -> None:
    with pytest.raises(ValueError):
        AckSettings.safe_defaults(0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"in_sync_replicas": 0, "min_in_sync_replicas": 0},
        {"in_sync_replicas": 2, "min_in_sync_replicas": 3},
        {"min_in_sync_replicas": 0},
        {"ha_max_gap_not_in_sync_bytes": -1},
    ],
)
def test_settings_out_of_range_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        AckSettings(**kwargs)  # type: ignore[arg-type]


def test_outcomes_say_whether_a_retry_helps() -> None:
    assert AckOutcome.PUT_OK.ok and not AckOutcome.PUT_OK.retriable
    assert REFUSED.retriable and AckOutcome.FLUSH_SLAVE_TIMEOUT.retriable


# -- need_ack_nums ------------------------------------------------------------------------


def reference_need(
    settings: AckSettings, sss: int, in_sync: int, alive: int, acting: bool
) -> object:
    """The rules restated case by case, as the brief gives them."""
    if in_sync < settings.min_in_sync_replicas:
        return REFUSED
    if acting:
        available = min(alive, in_sync)
        need = settings.in_sync_replicas
        if settings.enable_auto_in_sync_replicas:
            need = max(min(need, min(alive, in_sync)), settings.min_in_sync_replicas)
    else:
        available = in_sync
        need = sss if settings.all_ack_in_sync_state_set else settings.in_sync_replicas
    if need > available or need < settings.min_in_sync_replicas:
        return REFUSED
    return need


def test_need_matches_the_rules_everywhere() -> None:
    cases = 0
    for settings in all_settings():
        for sss, in_sync, alive, acting in all_situations():
            got = decide(settings, sss, in_sync, alive, acting)
            assert got == reference_need(settings, sss, in_sync, alive, acting), (
                settings,
                sss,
                in_sync,
                alive,
                acting,
            )
            cases += 1
    assert cases == 40 * 160


def test_need_is_never_below_the_minimum_nor_above_what_is_in_sync() -> None:
    for settings in all_settings():
        for sss, in_sync, alive, acting in all_situations():
            got = decide(settings, sss, in_sync, alive, acting)
            if got is REFUSED:
                continue
            assert isinstance(got, int)
            assert settings.min_in_sync_replicas <= got <= in_sync
            if acting:
                assert got <= alive


def test_too_few_in_sync_is_always_refused() -> None:
    for settings in all_settings():
        for sss, in_sync, alive, acting in all_situations():
            if in_sync < settings.min_in_sync_replicas:
                assert decide(settings, sss, in_sync, alive, acting) is REFUSED


def test_all_ack_needs_the_whole_sync_state_set() -> None:
    for settings in all_settings():
        if not settings.all_ack_in_sync_state_set:
            continue
        for sss, in_sync, alive, _ in all_situations():
            got = decide(settings, sss, in_sync, alive, False)
            assert got == sss or got is REFUSED
            assert (got is REFUSED) == (
                in_sync < settings.min_in_sync_replicas
                or sss < settings.min_in_sync_replicas
                or sss > in_sync
            )


def test_a_shrunken_sync_state_set_does_not_waive_the_minimum() -> None:
    settings = AckSettings(3, 2, all_ack_in_sync_state_set=True)
    # Both slaves are within the byte gap, but the controller has only the master in the set.
    assert decide(settings, 1, 3, 3, False) is REFUSED


def test_auto_in_sync_replicas_follows_what_is_alive() -> None:
    settings = AckSettings(3, 2, enable_auto_in_sync_replicas=True)
    assert decide(settings, 1, 3, 3, True) == 3
    assert decide(settings, 1, 3, 2, True) == 2  # one broker is gone
    assert decide(settings, 1, 2, 3, True) == 2
    assert decide(settings, 1, 1, 3, True) is REFUSED
    fixed = AckSettings(3, 2)
    assert decide(fixed, 1, 3, 2, True) is REFUSED


def test_impossible_inputs_are_errors() -> None:
    settings = AckSettings()
    for sss, in_sync, alive in [(0, 1, 1), (1, 0, 1), (1, 1, -1)]:
        with pytest.raises(ValueError):
            decide(settings, sss, in_sync, alive, False)


# -- in_sync_count ------------------------------------------------------------------------


def test_in_sync_count_counts_the_master_and_slaves_within_the_gap() -> None:
    assert in_sync_count(100, {}, 0) == 1
    assert in_sync_count(100, {1: 100, 2: 90, 3: 89}, 10) == 3
    assert in_sync_count(100, {1: 100}, 0) == 2  # caught up counts even with no gap allowed
    assert in_sync_count(100, {1: 130}, 0) == 2  # acked after master_offset was read


def test_in_sync_count_everywhere_in_a_small_space() -> None:
    for master_offset, gap in itertools.product(range(5), range(4)):
        for acks in itertools.product(range(6), repeat=3):
            acked = dict(zip(SLAVES, acks, strict=True))
            count = in_sync_count(master_offset, acked, gap)
            assert count == 1 + sum(master_offset - a <= gap for a in acks)
            assert 1 <= count <= 4
            assert count <= in_sync_count(master_offset, acked, gap + 1)


def test_in_sync_count_refuses_a_negative_gap() -> None:
    with pytest.raises(ValueError):
        in_sync_count(0, {}, -1)


# -- acks_reached -------------------------------------------------------------------------

ABSENT = -1


def ack_maps() -> Iterator[dict[int, int]]:
    """Every map of slave -> acked offset over offsets 0..2, slaves possibly not connected."""
    for offsets in itertools.product((ABSENT, 0, 1, 2), repeat=len(SLAVES)):
        yield {slave: o for slave, o in zip(SLAVES, offsets, strict=True) if o != ABSENT}


def sync_state_sets() -> list[frozenset[int] | None]:
    sizes = range(len(SLAVES) + 1)
    subsets = (m for size in sizes for m in itertools.combinations(SLAVES, size))
    return [None, *(frozenset((MASTER, *members)) for members in subsets)]


def all_ack_cases() -> Iterator[tuple[int, int, dict[int, int], frozenset[int] | None]]:
    yield from itertools.product((1, 2), range(1, 5), list(ack_maps()), sync_state_sets())


def test_without_a_set_any_slave_counts() -> None:
    for target, need, acked, _ in all_ack_cases():
        holders = sum(offset >= target for offset in acked.values())
        assert acks_reached(target, need, acked, None) == (1 + holders >= need)


def test_with_a_set_every_member_must_hold_the_write() -> None:
    for target, need, acked, sss in all_ack_cases():
        if sss is None or not acks_reached(target, need, acked, sss):
            continue
        for member in sss - {MASTER}:
            assert acked.get(member, ABSENT) >= target
        copies = 1 + sum(acked.get(slave, ABSENT) >= target for slave in sss - {MASTER})
        assert copies >= need


def test_with_a_set_only_members_count() -> None:
    sss = frozenset({MASTER, 1})
    assert not acks_reached(10, 2, {2: 10, 3: 10}, sss)
    assert acks_reached(10, 2, {1: 10, 2: 0}, sss)
    assert acks_reached(10, 1, {1: 10}, frozenset({MASTER, 1}))
    assert not acks_reached(10, 1, {}, frozenset({MASTER, 1}))  # member 1 not connected


def test_by_quorum_need_copies_among_members_settle_a_write_whoever_lags() -> None:
    for target, need, acked, sss in all_ack_cases():
        if sss is None:
            continue
        copies = 1 + sum(acked.get(slave, ABSENT) >= target for slave in sss - {MASTER})
        assert acks_reached(target, need, acked, sss, quorum=True) == (copies >= need)
    stalled = frozenset({MASTER, 1, 2})
    assert acks_reached(10, 2, {1: 10, 2: 0}, stalled, quorum=True)  # 2 holds nothing back
    assert not acks_reached(10, 2, {1: 0, 3: 10}, stalled, quorum=True)  # 3 is no member


def test_quorum_offset_is_what_the_quorum_holds() -> None:
    assert quorum_offset(100, [40, 70], 2) == 70
    assert quorum_offset(100, [40, 70], 3) == 40
    assert quorum_offset(100, [40, 70], 1) == 100
    assert quorum_offset(100, [40], 3) == 40  # fewer copies than the quorum: the lowest
    for ends in itertools.product((0, 5, 10), repeat=3):
        for need in range(1, 5):
            held = quorum_offset(10, list(ends), need)
            assert 1 + sum(e >= held for e in ends) >= min(need, 4)


def test_a_set_that_shrank_below_the_need_does_not_settle_for_less() -> None:
    assert not acks_reached(10, 3, {1: 10}, frozenset({MASTER, 1}))
    assert acks_reached(10, 2, {1: 10}, frozenset({MASTER, 1}))


def test_more_acks_never_undo_a_reached_write() -> None:
    for target, need, acked, sss in all_ack_cases():
        if not acks_reached(target, need, acked, sss):
            continue
        for slave in SLAVES:
            more = {**acked, slave: max(acked.get(slave, 0), 0) + 1}
            assert acks_reached(target, need, more, sss), (target, need, acked, sss, more)


def test_lower_targets_and_needs_never_undo_a_reached_write() -> None:
    for target, need, acked, sss in all_ack_cases():
        if acks_reached(target, need, acked, sss):
            assert acks_reached(target - 1, need, acked, sss)
            if need > 1:
                assert acks_reached(target, need - 1, acked, sss)


def test_the_master_alone_reaches_a_need_of_one() -> None:
    assert acks_reached(10, 1, {}, None)
    assert acks_reached(10, 1, {}, frozenset({MASTER}))
    with pytest.raises(ValueError):
        acks_reached(10, 0, {}, None)


def test_an_accepted_and_reached_write_has_the_minimum_copies() -> None:
    """End to end over the pure steps: accepted, then reached, means min copies exist."""
    for settings in all_settings():
        for sss, target in itertools.product(sync_state_sets(), (1, 2)):
            if sss is None:
                continue
            for acked in ack_maps():
                in_sync = in_sync_count(2, acked, 1)
                need = decide(settings, len(sss), in_sync, 4, False)
                if not isinstance(need, int):
                    continue
                members = sss if settings.all_ack_in_sync_state_set else None
                if acks_reached(target, need, acked, members):
                    holders = 1 + sum(offset >= target for offset in acked.values())
                    assert holders >= settings.min_in_sync_replicas
