"""The PullMessageService's OFFSET_ILLEGAL handling (seed 004), one step at a time with a
fake scheduler: drop the ProcessQueue at once, then 10 s later correct the offset to the
broker's `next_begin_offset`, write it down and hand the queue back to the rebalance. The
real-broker path is in test_consume_start_offsets.py; this covers the case a broker test
cannot set up on demand: the rebalance let the queue go and took it up again within those
10 s, so the correction belongs to a request that is no longer the queue's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.process_queue import ProcessQueue
from capstan.client.consumer.pull_service import (
    OFFSET_ILLEGAL_DROP_DELAY_S,
    PullMessageService,
    PullRequest,
)
from capstan.client.consumer.settings import ConsumerOptions
from capstan.client.metrics import ConsumerMetrics
from capstan.v1 import pull_pb2 as p
from tests.client.one_replica import OneReplica

Q = MessageQueue("T", "broker-a", 0)


class FakeScheduler:
    def __init__(self) -> None:
        self.jobs: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay_s: float, job: Callable[[], None]) -> None:
        self.jobs.append((delay_s, job))


class FakeOffsets:
    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    def update(self, queue: MessageQueue, offset: int, increase_only: bool = True) -> None:
        self.writes.append(("update", (queue, offset, increase_only)))

    def persist(self, queues: Any) -> None:
        self.writes.append(("persist", list(queues)))


class Answer:
    """A finished pull future."""

    def __init__(self, response: p.PullMessagesResponse) -> None:
        self.response = response

    def result(self) -> p.PullMessagesResponse:
        return self.response


ILLEGAL = p.PullMessagesResponse(
    status=p.OFFSET_ILLEGAL, next_begin_offset=40, min_offset=40, max_offset=100
)


class Harness:
    def __init__(self) -> None:
        self.scheduler = FakeScheduler()
        self.offsets = FakeOffsets()
        self.dropped: list[MessageQueue] = []
        self.service = PullMessageService(
            None,  # type: ignore[arg-type]  # no pull is started in these tests
            OneReplica(),
            ConsumerOptions(),
            self.offsets,  # type: ignore[arg-type]
            ConsumerMetrics("G", "client"),
            self.scheduler,  # type: ignore[arg-type]
            lambda *a: None,
            lambda queue, pq: self.dropped.append(queue),
            orderly=False,
        )

    def take_up(self, offset: int) -> PullRequest:
        """What the consumer does for a queue the rebalance gives it."""
        request = PullRequest(Q, ProcessQueue(), offset, "*")
        self.service.pull_now(request)
        return request

    def answer(self, request: PullRequest, response: p.PullMessagesResponse) -> None:
        self.service._on_answer(request, Answer(response))

    def run_later_jobs(self) -> list[float]:
        jobs, self.scheduler.jobs = self.scheduler.jobs, []
        for _, job in jobs:
            job()
        return [delay for delay, _ in jobs]


def test_an_illegal_offset_drops_the_queue_then_corrects_writes_and_hands_it_back():
    h = Harness()
    request = h.take_up(5)
    h.answer(request, ILLEGAL)
    assert request.process_queue.dropped  # nothing more is pulled or consumed from it
    assert h.offsets.writes == [] and h.dropped == []  # not yet
    assert h.run_later_jobs() == [OFFSET_ILLEGAL_DROP_DELAY_S]
    assert h.offsets.writes == [("update", (Q, 40, False)), ("persist", [Q])]
    assert h.dropped == [Q]  # the rebalance takes it up again from 40


def test_a_correction_outlived_by_a_newer_take_up_of_the_queue_does_nothing():
    """The queue was let go and taken up again while the correction waited: the new
    request pulls and commits for the queue now. The stale correction must neither move
    its offset nor hand the queue back: the consumer would forget the live ProcessQueue
    without stopping it and take the queue up a second time, two pull loops consuming
    every message twice."""
    h = Harness()
    old = h.take_up(5)
    h.answer(old, ILLEGAL)
    old.process_queue.dropped = True  # the rebalance let it go (it was already dropped)
    new = h.take_up(40)  # ...and took it up again, from the corrected committed offset
    h.run_later_jobs()
    assert h.offsets.writes == []
    assert h.dropped == []
    assert not new.process_queue.dropped


def test_each_take_up_that_meets_an_illegal_offset_corrects_once():
    """Taken up again before the first correction, the queue meets the illegal offset a
    second time: only the newer request's correction acts."""
    h = Harness()
    first = h.take_up(5)
    h.answer(first, ILLEGAL)
    second = h.take_up(5)
    h.answer(second, ILLEGAL)
    assert h.run_later_jobs() == [OFFSET_ILLEGAL_DROP_DELAY_S] * 2
    assert h.offsets.writes == [("update", (Q, 40, False)), ("persist", [Q])]
    assert h.dropped == [Q]
