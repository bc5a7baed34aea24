"""ConsumeMessageConcurrentlyService against a real broker: ackIndex inside batches of
`consume_message_batch_max_size` > 1, and the local retry after a send-back that fails
(seed 004: the message is consumed again here after 5 s and the offset waits)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest

from capstan.client.consumer.broker_calls import CALL_TIMEOUT_S
from capstan.client.consumer.consume_concurrently import LOCAL_RETRY_DELAY_S
from capstan.client.consumer.push_consumer import PushConsumer
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumerOptions,
    ConsumeStatus,
)
from tests.broker.broker_process import BrokerProcess
from tests.client.broker_calls import committed, produce
from tests.waiting import wait_until

FIRST = ConsumeFromWhere.FIRST_OFFSET
SUCCESS, LATER = ConsumeStatus.CONSUME_SUCCESS, ConsumeStatus.RECONSUME_LATER


@dataclass(frozen=True)
class Delivery:
    """One message as the listener got it, read at that moment (a message consumed again
    locally is the same object, its reconsume_times raised in place)."""

    body: str
    reconsume_times: int
    from_topic: str
    batch: int
    at: float


Decide = Callable[[Sequence[ReceivedMessage], ConsumeContext], ConsumeStatus]


class Listener:
    def __init__(self, decide: Decide) -> None:
        self.decide = decide
        self.lock = threading.Lock()
        self.deliveries: list[Delivery] = []
        self.batches: list[list[str]] = []

    def __call__(self, batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        now = time.monotonic()
        with self.lock:
            n = len(self.batches)
            self.batches.append([m.body.decode() for m in batch])
            for m in batch:
                d = Delivery(m.body.decode(), m.reconsume_times, m.message_queue.topic, n, now)
                self.deliveries.append(d)
        return self.decide(batch, ctx)

    def of(self, body: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.body == body]

    def seen(self) -> list[Delivery]:
        with self.lock:
            return list(self.deliveries)


def one_queue_topic(broker, group: str) -> str:
    topic = f"{group}-q1"
    broker.create_topic(topic, queues=1)
    return topic


@pytest.mark.parametrize(
    ("status", "failed_part"),
    [
        (SUCCESS, lambda batch: batch[2:]),  # ack_index 1: messages 0 and 1 succeeded
        (LATER, lambda batch: batch),  # RECONSUME_LATER fails the whole batch, ack_index or not
    ],
    ids=["success_with_ack_index_1", "reconsume_later"],
)
def test_ack_index_inside_a_batch_sends_back_exactly_the_messages_after_it(
    broker, names, status, failed_part
):
    _, group = names
    topic = one_queue_topic(broker, group)
    bodies = [f"m{i}" for i in range(8)]
    produce(broker, topic, bodies)

    def decide(batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        if batch[0].reconsume_times > 0:
            return SUCCESS  # the retries succeed
        ctx.ack_index = 1
        ctx.delay_level_when_next_consume = 1  # back after 1 s
        return status

    listener = Listener(decide)
    options = ConsumerOptions(
        consume_from_where=FIRST, consume_message_batch_max_size=4, persist_offset_interval_s=0.2
    )
    consumer = PushConsumer(broker.address, group, listener, options=options)
    consumer.subscribe(topic)
    retry = f"%RETRY%{group}"
    with consumer:
        wait_until(lambda: len(listener.seen()) >= 8, 20, "the first deliveries")
        first = listener.batches[:2]  # the retries come a second later at the earliest
        assert first == [bodies[:4], bodies[4:]]  # two batches of four, in offset order
        expected = sorted(m for batch in first for m in failed_part(batch))
        wait_until(
            lambda: len([d for d in listener.seen() if d.reconsume_times]) >= len(expected),
            20,
            "the failed messages back from the retry topic",
        )
        wait_until(lambda: committed(broker, group, topic, 0) == 8, 10, "offset past both")
        retry_end = broker.queue_ends(retry)[0]
        wait_until(
            lambda: committed(broker, group, retry, 0) == retry_end, 10, "retry offset committed"
        )
        time.sleep(1.5)  # nothing else may come back
    seen = listener.seen()
    assert sorted(d.body for d in seen if d.reconsume_times == 0) == bodies
    assert all(d.from_topic == topic for d in seen if d.reconsume_times == 0)
    retried = [d for d in seen if d.reconsume_times]
    assert sorted(d.body for d in retried) == expected  # exactly those, each once
    assert {(d.reconsume_times, d.from_topic) for d in retried} == {(1, retry)}
    assert retry_end == len(expected)  # the broker stored nothing else for retry
    labels = {"consumer_group": group, "client_id": consumer.client_id}
    failures = consumer.metrics.registry.get_sample_value("rocketmq_consume_failures_total", labels)
    assert failures == len(expected)


def test_a_failed_send_back_is_consumed_again_locally_after_5_s_and_holds_the_offset(
    tmp_path,
):
    """The broker stops answering (SIGSTOP) while the listener fails a message, so its
    send-back times out: the message stays cached, the committed offset stops at it while
    the messages after it are consumed, and the same consumer hands it to the listener
    again about 5 s after the failed send-back, counted as a reconsumption."""
    broker = BrokerProcess(tmp_path, consumer_groups={"member_expiry_s": 120}).start()
    try:
        _consume_again_locally(broker)
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            os.kill(broker.proc.pid, signal.SIGCONT)
        broker.stop()


def _consume_again_locally(broker: BrokerProcess) -> None:
    group = "G"
    broker.create_group(group)
    topic = one_queue_topic(broker, group)
    bodies = ["m0", "bad", "m2", "m3", "m4"]
    produce(broker, topic, bodies)
    assert broker.proc is not None
    pid = broker.proc.pid

    def decide(batch: Sequence[ReceivedMessage], ctx: ConsumeContext) -> ConsumeStatus:
        if batch[0].body == b"bad" and batch[0].reconsume_times == 0:
            os.kill(pid, signal.SIGSTOP)  # the send-back that follows gets no answer
            return LATER
        return SUCCESS

    listener = Listener(decide)
    options = ConsumerOptions(consume_from_where=FIRST, persist_offset_interval_s=0.2)
    consumer = PushConsumer(broker.address, group, listener, options=options)
    consumer.subscribe(topic)
    labels = {"consumer_group": group, "client_id": consumer.client_id}
    get = consumer.metrics.registry.get_sample_value
    commits: list[int] = []
    with consumer:
        wait_until(
            lambda: get("capstan_send_back_total", {**labels, "result": "failed"}) == 1,
            CALL_TIMEOUT_S + 15,
            "the send-back to time out",
        )
        failed_at = time.monotonic()
        os.kill(pid, signal.SIGCONT)
        # While it waits, every commit stops at "bad" (offset 1), though 2..4 are done.
        while len(listener.of("bad")) < 2 and time.monotonic() - failed_at < 20:
            commits.append(committed(broker, group, topic, 0))
            time.sleep(0.1)
        wait_until(lambda: committed(broker, group, topic, 0) == 5, 10, "the offset at the end")
    again = listener.of("bad")
    assert [d.reconsume_times for d in again] == [0, 1]
    assert {d.from_topic for d in again} == {topic}  # from the cache, not the retry topic
    waited = again[1].at - failed_at
    assert LOCAL_RETRY_DELAY_S - 1 <= waited <= LOCAL_RETRY_DELAY_S + 10, waited
    assert commits and max(commits) <= 1 and commits[-1] == 1, commits
    assert sorted(d.body for d in listener.seen()) == sorted([*bodies, "bad"])
    assert get("capstan_send_back_total", {**labels, "result": "ok"}) is None
