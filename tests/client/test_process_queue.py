"""ProcessQueue: flow-control figures, the commit point never passes an unconsumed
message, and orderly take/commit/put-back."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from capstan.client.consumer.process_queue import ProcessQueue


@dataclass(frozen=True)
class Msg:
    queue_offset: int
    body: bytes = b"x" * 10


def msgs(*offsets: int) -> list[Msg]:
    return [Msg(o) for o in offsets]


def test_figures_the_pull_loop_throttles_on():
    pq: ProcessQueue[Msg] = ProcessQueue()
    assert (pq.count, pq.size_bytes, pq.span) == (0, 0, 0)
    assert pq.put(msgs(100, 101, 102)) == 3
    assert pq.put(msgs(102, 2100)) == 1  # 102 is already cached
    assert (pq.count, pq.size_bytes, pq.span) == (4, 40, 2000)


def test_commit_point_is_the_smallest_unconsumed_offset():
    pq: ProcessQueue[Msg] = ProcessQueue()
    assert pq.remove([]) == -1  # nothing ever cached
    pq.put(msgs(5, 6, 7, 8))
    assert pq.remove(msgs(6, 8)) == 5  # 5 is still being consumed
    assert pq.remove(msgs(5)) == 7
    assert pq.remove(msgs(7)) == 9  # all consumed: one past the highest
    assert (pq.count, pq.size_bytes) == (0, 0)
    assert pq.remove(msgs(7)) == 9  # removing twice is harmless


@given(st.lists(st.integers(0, 200), min_size=1, max_size=60, unique=True), st.randoms())
@settings(max_examples=200, deadline=None)
def test_the_commit_point_never_skips_an_unconsumed_message(offsets, rnd):
    pq: ProcessQueue[Msg] = ProcessQueue()
    pq.put(msgs(*offsets))
    pending = set(offsets)
    order = list(offsets)
    rnd.shuffle(order)
    for o in order:
        point = pq.remove(msgs(o))
        pending.discard(o)
        expected = min(pending) if pending else max(offsets) + 1
        assert point == expected
        assert pq.count == len(pending)


def test_orderly_take_commit_and_put_back():
    pq: ProcessQueue[Msg] = ProcessQueue()
    pq.put(msgs(10, 11, 12, 13, 14))
    first = pq.take(2)
    assert [m.queue_offset for m in first] == [10, 11]
    assert pq.count == 5  # taken messages still count against flow control
    assert pq.remove([]) == 10  # nothing past the taken batch may be committed
    assert pq.commit() == 12
    assert pq.commit() == -1
    again = pq.take(2)
    pq.put_back(again)  # SUSPEND_CURRENT_QUEUE_A_MOMENT
    assert [m.queue_offset for m in pq.take(3)] == [12, 13, 14]  # same order, none lost
    assert pq.commit() == 15
    assert (pq.count, pq.size_bytes) == (0, 0)


def test_a_puller_and_concurrent_consumers_leave_nothing_behind():
    """The pull thread caches each batch and hands it to consume threads, which remove
    what they consumed, in any order (as ConsumeMessageConcurrentlyService does)."""
    pq: ProcessQueue[Msg] = ProcessQueue()
    total, workers = 5000, 4
    work: queue.Queue[list[Msg] | None] = queue.Queue()
    points: list[int] = []

    def puller() -> None:
        for start in range(0, total, 50):
            batch = msgs(*range(start, start + 50))
            pq.put(batch)
            for n in range(0, 50, 8):
                work.put(batch[n : n + 8])
        for _ in range(workers):
            work.put(None)

    def consumer() -> None:
        while (batch := work.get()) is not None:
            points.append(pq.remove(batch))

    threads = [threading.Thread(target=puller)] + [
        threading.Thread(target=consumer) for _ in range(workers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert pq.count == 0 and pq.size_bytes == 0 and pq.span == 0
    assert pq.remove([]) == total
    assert max(points) == total and min(points) >= 0
