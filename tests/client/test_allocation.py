"""Allocation strategies: every queue has exactly one owner, shares as each strategy
promises, and the sticky one moves the fewest queues any balanced assignment could."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capstan.client.consumer.allocation import (
    allocate_averagely,
    allocate_averagely_by_circle,
    allocate_consistent_hash,
    allocate_sticky,
    owners,
)

Queue = tuple[str, str, int]  # (topic, broker, queue id)


def queues(n: int, brokers: int = 1) -> list[Queue]:
    return [("T", f"broker-{b}", q) for b in range(brokers) for q in range(n)]


def clients(n: int) -> list[str]:
    return [f"10.0.0.{i}@{1000 + i}" for i in range(n)]


STRATEGIES: dict[str, Callable[[Sequence[Queue], Sequence[str]], dict[str, list[Queue]]]] = {
    "averagely": allocate_averagely,
    "averagely_by_circle": allocate_averagely_by_circle,
    "consistent_hash": allocate_consistent_hash,
    "sticky_from_nothing": lambda q, c: allocate_sticky(q, c, {}),
}


def check_partition(assignment: dict[str, list[Queue]], qs: list[Queue], cs: list[str]) -> None:
    assert sorted(assignment) == sorted(cs)
    handed = [q for owned in assignment.values() for q in owned]
    assert sorted(handed) == sorted(qs)  # every queue exactly once
    for owned in assignment.values():
        assert owned == sorted(owned)


def spread(assignment: dict[str, list[Queue]]) -> int:
    sizes = [len(v) for v in assignment.values()]
    return max(sizes) - min(sizes) if sizes else 0


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_queue_has_exactly_one_owner_for_every_small_group(name):
    allocate = STRATEGIES[name]
    for n_queues, n_clients, brokers in itertools.product(range(13), range(1, 7), (1, 2)):
        qs, cs = queues(n_queues, brokers), clients(n_clients)
        assignment = allocate(qs, cs)
        check_partition(assignment, qs, cs)
        # the inputs' order does not matter: every member computes the same answer
        assert allocate(list(reversed(qs)), list(reversed(cs))) == assignment
        if name != "consistent_hash":
            assert spread(assignment) <= 1


def test_averagely_hands_out_contiguous_runs_bigger_first():
    qs, cs = queues(8), clients(3)
    got = allocate_averagely(qs, cs)
    assert [len(got[c]) for c in cs] == [3, 3, 2]
    assert got[cs[0]] == qs[0:3] and got[cs[1]] == qs[3:6] and got[cs[2]] == qs[6:8]
    few = allocate_averagely(queues(2), clients(4))
    assert [len(few[c]) for c in clients(4)] == [1, 1, 0, 0]


def test_averagely_by_circle_deals_queues_in_turn():
    qs, cs = queues(7), clients(3)
    got = allocate_averagely_by_circle(qs, cs)
    assert got[cs[0]] == [qs[0], qs[3], qs[6]]
    assert got[cs[1]] == [qs[1], qs[4]]
    assert got[cs[2]] == [qs[2], qs[5]]


def test_no_clients_no_owners_and_duplicates_are_refused():
    assert allocate_averagely(queues(3), []) == {}
    with pytest.raises(ValueError, match="unique"):
        allocate_averagely(queues(3), ["a", "a"])
    with pytest.raises(ValueError, match="unique"):
        allocate_sticky(queues(2) * 2, ["a"], {})


@given(st.integers(1, 40), st.integers(1, 8), st.integers(0, 7))
@settings(max_examples=150, deadline=None)
def test_consistent_hash_moves_only_what_the_newcomer_takes(n_queues, n_clients, newcomer):
    qs, cs = queues(n_queues), clients(n_clients)
    joined = f"new-{newcomer}@9"
    before = owners(allocate_consistent_hash(qs, cs))
    after = owners(allocate_consistent_hash(qs, [*cs, joined]))
    for q in qs:
        assert after[q] in (before[q], joined)
    # and when it leaves again, everything goes back where it was
    assert owners(allocate_consistent_hash(qs, cs)) == before


def fewest_moves(qs: list[Queue], cs: list[str], previous: dict[Queue, str]) -> int:
    """By brute force: the fewest queues whose owner changes, over all balanced
    assignments of qs to cs."""
    share, extra = divmod(len(qs), len(cs))
    best = len(qs)
    for owners_ in itertools.product(cs, repeat=len(qs)):
        sizes = sorted((owners_.count(c) for c in cs), reverse=True)
        if sizes != [share + 1] * extra + [share] * (len(cs) - extra):
            continue
        best = min(best, sum(previous.get(q) != o for q, o in zip(qs, owners_, strict=True)))
    return best


def test_sticky_moves_the_minimum_for_every_small_previous_assignment():
    for n_queues, n_before in itertools.product(range(1, 6), range(1, 4)):
        qs = queues(n_queues)
        before = clients(n_before)
        for previous_owners in itertools.product(before, repeat=n_queues):
            previous = dict(zip(qs, previous_owners, strict=True))
            for now in (before, [*before, "joiner@1"], before[1:] or before):
                got = allocate_sticky(qs, now, previous)
                check_partition(got, qs, now)
                assert spread(got) <= 1
                moved = sum(previous[q] != o for q, o in owners(got).items())
                assert moved == fewest_moves(qs, now, previous), (previous, now, got)


@given(st.integers(1, 64), st.integers(1, 10), st.data())
@settings(max_examples=200, deadline=None)
def test_sticky_membership_changes_move_only_what_balance_requires(n_queues, n_clients, data):
    qs, cs = queues(n_queues), clients(n_clients)
    start = allocate_sticky(qs, cs, {})
    previous = owners(start)

    # A member leaves: only its queues move; everyone else keeps all it had.
    if n_clients > 1:
        gone = data.draw(st.sampled_from(cs))
        left = allocate_sticky(qs, [c for c in cs if c != gone], previous)
        check_partition(left, qs, [c for c in cs if c != gone])
        assert spread(left) <= 1
        for q, o in owners(left).items():
            assert previous[q] == gone or o == previous[q]

    # A member joins: it takes about a fair share, and only those queues move.
    joined = allocate_sticky(qs, [*cs, "joiner@1"], previous)
    check_partition(joined, qs, [*cs, "joiner@1"])
    assert spread(joined) <= 1
    moved = [q for q, o in owners(joined).items() if o != previous[q]]
    assert all(owners(joined)[q] == "joiner@1" for q in moved)
    assert len(moved) == len(joined["joiner@1"]) == n_queues // (n_clients + 1)
