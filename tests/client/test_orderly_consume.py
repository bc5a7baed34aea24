"""Orderly consumption against a real broker, where it is easy to get wrong: a queue taken
away or given back while a slow batch runs, and messages suspended until the DLQ (alone
and in a batch with others). Each test uses a one-queue topic, so one thread and one
broker lock decide everything."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from itertools import pairwise

from capstan.client.consumer.push_consumer import REMOVE_WAIT_S, PushConsumer
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumerOptions,
    ConsumeStatus,
)
from tests.broker.broker_process import BrokerProcess
from tests.broker.test_batch_pull import pull, puller
from tests.client.broker_calls import committed, produce
from tests.waiting import wait_until

# No periodic rebalance within a test: what happens must come from notifications.
OPTIONS = ConsumerOptions(
    consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
    rebalance_interval_s=3600,
    heartbeat_interval_s=1.0,
)
PAUSE_MS = 300
REBALANCE_RUNS_S = 1.0
SUCCESS = ConsumeStatus.CONSUME_SUCCESS
SUSPEND = ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
Decide = Callable[[Sequence[ReceivedMessage], ConsumeContext], ConsumeStatus]


class Calls:
    """A listener recording each call: when, and (body, reconsume times) per message as
    they were at the call (the SDK counts local retries on the same objects)."""

    def __init__(self, decide: Decide | None = None) -> None:
        self.calls: list[tuple[float, list[tuple[str, int]]]] = []
        self.lock = threading.Lock()
        self.decide = decide

    def __call__(self, batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        with self.lock:
            self.calls.append((time.time(), [(m.body.decode(), m.reconsume_times) for m in batch]))
        return self.decide(batch, ctx) if self.decide is not None else SUCCESS

    def batches(self) -> list[list[tuple[str, int]]]:
        with self.lock:
            return [batch for _, batch in self.calls]

    def bodies(self) -> list[str]:
        return [body for batch in self.batches() for body, _ in batch]

    def first_at(self) -> float:
        with self.lock:
            return self.calls[0][0]


class SlowFirst:
    """Decides CONSUME_SUCCESS, but holds the batch holding "m0" until `gate` opens."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.gate = threading.Event()
        self.ended_at = 0.0

    def __call__(self, batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        if any(m.body == b"m0" for m in batch):
            self.started.set()
            self.gate.wait(60)
            self.ended_at = time.time()
        return SUCCESS


def one_queue_topic(broker: BrokerProcess, group: str, count: int) -> str:
    topic = f"{group}-one"
    broker.create_topic(topic, queues=1)
    produce(broker, topic, [f"m{i}" for i in range(count)])
    return topic


def test_a_hand_over_waits_for_the_running_batch_and_the_next_owner_starts_after_it(broker, names):
    _, group = names
    topic = one_queue_topic(broker, group, 10)
    slow = SlowFirst()
    old, new = Calls(slow), Calls()
    first = PushConsumer(
        broker.address, group, old, orderly=True, options=OPTIONS, client_id="member-2"
    )
    second = PushConsumer(
        broker.address, group, new, orderly=True, options=OPTIONS, client_id="member-1"
    )
    first.subscribe(topic)
    second.subscribe(topic)
    with first:
        assert slow.started.wait(20), "the slow batch never started"
        with second:  # sorts first: the queue is now its own, once the broker lock is free
            time.sleep(REMOVE_WAIT_S + 2.5)  # several attempts to let go, each timing out
            # The first member still holds the broker lock: nothing reached the second.
            assert new.batches() == []
            assert [q for q in second.owned_queues() if q.topic == topic] == []
            slow.gate.set()
            wait_until(lambda: len(new.bodies()) >= 9, 20, "the rest of the queue, moved over")
            time.sleep(0.3)
    assert old.bodies() == ["m0"]
    # After the batch, exactly after it: m0's offset was committed before the unlock.
    assert new.bodies() == [f"m{i}" for i in range(1, 10)]
    assert new.first_at() >= slow.ended_at > 0
    assert committed(broker, group, topic, 0) == 10


def test_a_queue_given_back_while_its_removal_waits_for_a_batch_is_consumed_on(
    broker, names, caplog
):
    """The removal could not finish (the batch ran on); the queue comes back before the
    next try. It must not stay owned but never pulled or consumed again."""
    _, group = names
    topic = one_queue_topic(broker, group, 10)
    slow = SlowFirst()
    old, new = Calls(slow), Calls()
    first = PushConsumer(
        broker.address, group, old, orderly=True, options=OPTIONS, client_id="member-2"
    )
    second = PushConsumer(
        broker.address, group, new, orderly=True, options=OPTIONS, client_id="member-1"
    )
    first.subscribe(topic)
    second.subscribe(topic)
    caplog.set_level(logging.INFO, logger="capstan.client.consumer.push_consumer")
    with first:
        assert slow.started.wait(20), "the slow batch never started"
        second.start()
        wait_until(
            lambda: "a batch is still running" in caplog.text, 15, "a removal waiting on the batch"
        )
        second.shutdown()  # never got the lock; the queue is the first member's again
        # Time for the first member's rebalance on that news to run through; a rebalance's
        # start is counted, its end shows nowhere.
        time.sleep(REBALANCE_RUNS_S)
        slow.gate.set()
        wait_until(lambda: len(old.bodies()) >= 10, 20, "the rest of the queue, consumed on")
        time.sleep(0.3)
    assert old.bodies() == [f"m{i}" for i in range(10)]
    assert new.batches() == []
    assert committed(broker, group, topic, 0) == 10


def test_a_message_suspended_too_often_goes_to_the_dlq_and_the_queue_moves_on(broker, names):
    _, group = names
    topic = f"{group}-one"
    broker.create_topic(topic, queues=1)
    produce(broker, topic, ["a", "poison", "b"])

    def decide(batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        if batch[0].body == b"poison":
            ctx.suspend_ms = PAUSE_MS
            return SUSPEND
        return SUCCESS

    seen = Calls(decide)
    options = ConsumerOptions(
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET, max_reconsume_times=2
    )
    consumer = PushConsumer(broker.address, group, seen, orderly=True, options=options)
    consumer.subscribe(topic)
    dlq = f"%DLQ%{group}"
    with consumer:
        wait_until(lambda: "b" in seen.bodies(), 20, "the message after the poison one")
        wait_until(lambda: broker.dead_letters(group) == 1, 10, "the poison message in the DLQ")
        time.sleep(0.5)
    assert seen.batches() == [
        [("a", 0)],
        [("poison", 0)],
        [("poison", 1)],
        [("poison", 2)],  # failed max_reconsume_times times already: dead-lettered
        [("b", 0)],
    ]
    # Each try came after the pause the listener asked for, not at once.
    tries = [at for at, batch in seen.calls if batch[0][0] == "poison"]
    gaps = [later - earlier for earlier, later in pairwise(tries)]
    assert min(gaps) >= PAUSE_MS / 1000 * 0.9, gaps
    assert broker.queue_ends(dlq) == [1]
    dead = pull(puller(broker.address), 0, topic=dlq, group=group).messages
    assert [m.body for m in dead] == [b"poison"]
    assert committed(broker, group, topic, 0) == 3


def test_only_the_spent_messages_of_a_mixed_batch_go_to_the_dlq(broker, names):
    """Batches of 2: "poison" fails alone once, then shares a batch with "q" that has not
    failed before. Only "poison" may go to the DLQ, once; "q" is tried again, in order."""
    _, group = names
    topic = f"{group}-one"
    broker.create_topic(topic, queues=1)
    produce(broker, topic, ["poison"])

    def decide(batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        if any(m.body == b"poison" for m in batch):
            ctx.suspend_ms = 1000  # time for "q" and "r" to be pulled behind it
            return SUSPEND
        return SUCCESS

    seen = Calls(decide)
    options = ConsumerOptions(
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        consume_message_batch_max_size=2,
        max_reconsume_times=1,
    )
    consumer = PushConsumer(broker.address, group, seen, orderly=True, options=options)
    consumer.subscribe(topic)
    dlq = f"%DLQ%{group}"
    with consumer:
        wait_until(lambda: seen.batches(), 20, "the first try of the poison message")
        produce(broker, topic, ["q", "r"])
        wait_until(lambda: seen.bodies().count("r") >= 1, 20, "the messages after it")
        time.sleep(1.5)  # a wrongly re-queued poison message would come again by now
    batches = seen.batches()
    assert batches[:2] == [[("poison", 0)], [("poison", 1), ("q", 0)]], batches
    # Then "q" (failed once, with "poison") and "r", and nothing else.
    assert [m for batch in batches[2:] for m in batch] == [("q", 1), ("r", 0)], batches
    dead = pull(puller(broker.address), 0, topic=dlq, group=group).messages
    assert [m.body for m in dead] == [b"poison"]
    assert committed(broker, group, topic, 0) == 3
