"""The pure decisions of a receive: queue order, whose turn is next, and when a queue with
messages in flight can hand out again."""

from __future__ import annotations

import pytest

from capstan.broker.pop.pop_state import InFlight, QueuePop
from capstan.broker.pop.queue_choice import next_start, queue_order, redeliverable_at

LIMIT = 3  # deliveries before a message is dead-lettered
NOW = 10_000


def test_queue_order_visits_every_queue_once_from_the_start():
    assert queue_order(4, 0) == [0, 1, 2, 3]
    assert queue_order(4, 3) == [3, 0, 1, 2]
    assert queue_order(0, 0) == []


@pytest.mark.parametrize("holding", [{1, 5, 7}, {0, 1}, {6}, {0, 7}, set(range(8))])
def test_queues_holding_messages_take_turns_whatever_lies_between_them(holding):
    """Receives of one message each, from queues that never run dry: every queue holding
    messages is served once per round, in queue order."""
    start, served = 0, []
    for _ in range(5 * len(holding)):
        qid = next((q for q in queue_order(8, start) if q in holding), None)
        served.append(qid)
        start = next_start(8, start, qid)
    rounds = [served[i : i + len(holding)] for i in range(0, len(served), len(holding))]
    assert all(sorted(r) == sorted(holding) for r in rounds), served


def test_a_receive_that_found_nothing_moves_the_start_on_by_one():
    assert next_start(8, 6, None) == 7
    assert next_start(8, 7, None) == 0
    assert next_start(8, 2, 5) == 6
    assert next_start(0, 0, None) == 0


def queue(*entries: tuple[int, int]) -> QueuePop:
    """In flight: (visible_at_ms, attempt) per offset."""
    q = QueuePop(len(entries))
    for off, (visible_at, attempt) in enumerate(entries):
        q.inflight[off] = InFlight(off + 1, visible_at, attempt)
    q.recompute_due()
    return q


def test_nothing_in_flight_never_comes_due():
    assert redeliverable_at(queue(), fifo=True, limit=LIMIT, now_ms=NOW) is None
    assert redeliverable_at(queue(), fifo=False, limit=LIMIT, now_ms=NOW) is None


def test_a_fifo_queue_hands_out_again_once_nothing_of_it_is_invisible():
    q = queue((NOW - 5, 1), (NOW + 300, 1), (NOW + 100, 2))
    assert redeliverable_at(q, fifo=True, limit=LIMIT, now_ms=NOW) == NOW + 300


def test_a_fifo_queue_blocked_by_an_exhausted_message_waits_for_the_revive():
    q = queue((NOW - 5, LIMIT), (NOW + 300, 1))
    assert redeliverable_at(q, fifo=True, limit=LIMIT, now_ms=NOW) is None


def test_other_queues_hand_out_again_when_their_first_live_message_comes_due():
    q = queue((NOW + 300, 1), (NOW + 100, 2))
    assert redeliverable_at(q, fifo=False, limit=LIMIT, now_ms=NOW) == NOW + 100
    # Past its due time only exhausted messages remain: those wait for the revive.
    q = queue((NOW - 5, LIMIT), (NOW + 200, 1))
    assert redeliverable_at(q, fifo=False, limit=LIMIT, now_ms=NOW) == NOW + 200
    assert redeliverable_at(queue((NOW - 5, LIMIT)), fifo=False, limit=LIMIT, now_ms=NOW) is None
