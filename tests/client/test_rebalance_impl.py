"""RebalanceImpl over a fake route and member list: a queue whose removal is refused stays
owned and is tried again; if it is assigned back meanwhile it is kept (its pending removal
called off) or, when no longer consumed, let go and taken up afresh."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.rebalance import RebalanceImpl
from capstan.client.consumer.settings import ConsumerOptions
from tests.client.one_replica import OneReplica

ADDRESS = "127.0.0.1:1"


@dataclass
class RouteQueue:
    topic: str
    broker_name: str
    queue_id: int
    address: str = ADDRESS


@dataclass
class Member:
    client_id: str
    owned: list[Any] = field(default_factory=list)


class FakeRoute:
    def __init__(self, queues: int) -> None:
        self.queues = [RouteQueue("T", "b", i) for i in range(queues)]

    def read_queues(self, topic: str) -> list[RouteQueue]:
        return list(self.queues)

    def cached(self, topic: str) -> list[RouteQueue]:
        return list(self.queues)


class FakeCalls:
    def __init__(self, *client_ids: str) -> None:
        self.client_ids = list(client_ids)

    def members(self, address: str) -> list[Member]:
        return [Member(cid) for cid in self.client_ids]


class Hooks:
    """The PushConsumer's side: which queues it consumes; `busy` ones refuse removal."""

    def __init__(self) -> None:
        self.consumed: set[MessageQueue] = set()
        self.busy: set[MessageQueue] = set()
        self.stale: set[MessageQueue] = set()
        self.log: list[tuple[str, int]] = []

    def add(self, queue: MessageQueue, expression: str) -> bool:
        self.log.append(("add", queue.queue_id))
        self.consumed.add(queue)
        return True

    def remove(self, queue: MessageQueue) -> bool:
        self.log.append(("remove", queue.queue_id))
        if queue in self.busy:
            return False
        self.consumed.discard(queue)
        self.stale.discard(queue)
        return True

    def keep(self, queue: MessageQueue) -> bool:
        self.log.append(("keep", queue.queue_id))
        return queue not in self.stale


def impl(calls: FakeCalls, hooks: Hooks) -> RebalanceImpl:
    r = RebalanceImpl(
        "me",
        ConsumerOptions(),
        FakeRoute(2),  # type: ignore[arg-type]
        calls,  # type: ignore[arg-type]
        OneReplica(ADDRESS),
        hooks.add,
        hooks.remove,
        hooks.keep,
    )
    r.subscriptions["T"] = "*"
    return r


def q(i: int) -> MessageQueue:
    return MessageQueue("T", "b", i)


def test_a_refused_removal_keeps_the_queue_owned_and_is_tried_again():
    calls, hooks = FakeCalls("me"), Hooks()
    r = impl(calls, hooks)
    assert r.rebalance()
    assert set(r.owned()) == {q(0), q(1)}
    calls.client_ids = ["a-other", "me"]  # "a-other" sorts first: it gets queue 0
    hooks.busy.add(q(0))
    assert not r.rebalance()
    assert set(r.owned()) == {q(0), q(1)}
    hooks.busy.clear()
    hooks.log.clear()
    assert r.rebalance()
    assert set(r.owned()) == {q(1)}
    assert hooks.log == [("remove", 0), ("keep", 1)]


def test_a_queue_assigned_back_while_its_removal_is_pending_is_kept():
    calls, hooks = FakeCalls("me"), Hooks()
    r = impl(calls, hooks)
    r.rebalance()
    calls.client_ids = ["a-other", "me"]
    hooks.busy.add(q(0))
    r.rebalance()
    calls.client_ids = ["me"]  # the other left before the removal could finish
    hooks.log.clear()
    assert not r.rebalance()
    assert hooks.log == [("keep", 0), ("keep", 1)]  # not removed, not added again
    assert set(r.owned()) == {q(0), q(1)}


def test_an_owned_queue_no_longer_consumed_is_let_go_and_taken_up_afresh():
    calls, hooks = FakeCalls("me"), Hooks()
    r = impl(calls, hooks)
    r.rebalance()
    hooks.stale.add(q(0))
    hooks.busy.add(q(0))
    hooks.log.clear()
    assert not r.rebalance()  # cannot let go of it yet: stays owned, tried again
    assert hooks.log == [("keep", 0), ("remove", 0), ("keep", 1)]
    hooks.busy.clear()
    hooks.log.clear()
    assert r.rebalance()
    assert hooks.log == [("keep", 0), ("remove", 0), ("add", 0), ("keep", 1)]
    assert set(r.owned()) == {q(0), q(1)}


class SlowHooks(Hooks):
    """A round that dwells on each queue (a loaded machine); `consumed` is the consumer's
    table, a queue taken up while consumed is a second pull loop on it."""

    def __init__(self) -> None:
        super().__init__()
        self.in_round = threading.Event()
        self.twice: list[int] = []

    def add(self, queue: MessageQueue, expression: str) -> bool:
        if queue in self.consumed:
            self.twice.append(queue.queue_id)
        return super().add(queue, expression)

    def keep(self, queue: MessageQueue) -> bool:
        self.in_round.set()
        time.sleep(0.3)
        super().keep(queue)
        return queue in self.consumed and queue not in self.stale


def test_a_queue_dropped_from_outside_during_a_round_is_taken_up_again_once():
    """The pull service drops a queue (an illegal offset) while a round runs: the round
    must not see it half-dropped (unconsumed yet owned: it would take it up, and the next
    round, finding it no longer owned, take it up again, two loops consuming it twice)."""
    calls, hooks = FakeCalls("me"), SlowHooks()
    r = impl(calls, hooks)
    r.rebalance()
    hooks.log.clear()
    a_round = threading.Thread(target=r.rebalance)
    a_round.start()
    assert hooks.in_round.wait(5)

    def release() -> bool:  # what the consumer does: its ProcessQueue leaves the table
        hooks.consumed.discard(q(0))
        return True

    assert r.forget(q(0), release)
    a_round.join(5)
    r.rebalance()
    assert hooks.twice == []
    assert [e for e in hooks.log if e[0] == "add"] == [("add", 0)]
    assert set(r.owned()) == {q(0), q(1)} and hooks.consumed == {q(0), q(1)}


def test_a_drop_refused_by_the_consumer_leaves_the_queue_owned():
    """The correction was for a ProcessQueue already replaced: the queue stays owned."""
    calls, hooks = FakeCalls("me"), Hooks()
    r = impl(calls, hooks)
    r.rebalance()
    assert not r.forget(q(0), lambda: False)
    assert set(r.owned()) == {q(0), q(1)}
