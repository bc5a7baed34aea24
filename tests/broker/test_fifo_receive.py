"""FIFO receive with the official SimpleConsumer: any queue of the topic holding a
deliverable message serves a receive, whichever queue the client aimed it at, and a message
group still never gets a later message while an earlier one is in flight."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import zlib
from collections.abc import Iterator

import pytest
from rocketmq import FilterExpression, Message, Producer, SimpleConsumer

from tests.broker.broker_process import BrokerProcess
from tests.broker.test_official_client import config, message
from tests.waiting import wait_until

QUEUES = 8
LONG_POLLING_S = 5


def groups_in_distinct_queues(count: int) -> list[str]:
    """Message group names that the broker (crc32 of the group) puts in `count` different
    queues of a topic of QUEUES queues."""
    by_queue: dict[int, str] = {}
    for n in range(1000):
        by_queue.setdefault(zlib.crc32(f"mg{n}".encode()) % QUEUES, f"mg{n}")
        if len(by_queue) == count:
            break
    return list(by_queue.values())


def send_fifo(broker: BrokerProcess, topic: str, items: list[tuple[str, int]]) -> None:
    producer = Producer(config(broker), (topic,))
    producer.startup()
    try:
        for group, seq in items:
            producer.send(message(topic, f"{group}:{seq}".encode(), message_group=group))
    finally:
        producer.shutdown()


def parsed(m: Message) -> tuple[str, int]:
    group, seq = m.body.decode().split(":")
    return group, int(seq)


@pytest.fixture
def fifo(broker: BrokerProcess) -> Iterator[SimpleConsumer]:
    broker.create_topic("Fifo", kind="FIFO", queues=QUEUES)
    broker.create_group("G", fifo=True)
    consumer = SimpleConsumer(
        config(broker), "G", {"Fifo": FilterExpression("*")}, await_duration=LONG_POLLING_S
    )
    consumer.startup()
    try:
        yield consumer
    finally:
        consumer.shutdown()


def suspended_long_polls(broker: BrokerProcess) -> int:
    url = f"http://127.0.0.1:{broker.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    found = re.search(r"^capstan_long_polls_suspended\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert found, "the broker exports capstan_long_polls_suspended"
    return int(float(found.group(1)))


class Receiver:
    """One receive running in a thread, so the test can act while it is suspended."""

    def __init__(self, consumer: SimpleConsumer) -> None:
        self.got: list[Message] = []
        self.returned_at = 0.0
        self._thread = threading.Thread(target=self._run, args=(consumer,), daemon=True)
        self._thread.start()

    def _run(self, consumer: SimpleConsumer) -> None:
        self.got = consumer.receive(32, 10)
        self.returned_at = time.monotonic()

    def join(self) -> list[Message]:
        self._thread.join(LONG_POLLING_S + 10)
        assert not self._thread.is_alive()
        return self.got


def test_drain_with_empty_queues_pays_no_long_polling_and_keeps_each_group_in_order(broker, fifo):
    groups = groups_in_distinct_queues(3)  # 5 of the 8 queues stay empty
    send_fifo(broker, "Fifo", [(g, i) for i in range(20) for g in groups])
    seen: dict[str, list[int]] = {g: [] for g in groups}
    receives: list[set[str]] = []
    started = time.monotonic()
    while sum(map(len, seen.values())) < 60 and time.monotonic() - started < 30:
        got = fifo.receive(5, 10)
        receives.append({parsed(m)[0] for m in got})
        for m in got:
            assert m.delivery_attempt == 1  # nothing came back: no retry, no duplicate
            group, seq = parsed(m)
            seen[group].append(seq)
            fifo.ack(m)
    elapsed = time.monotonic() - started
    empty = sum(1 for r in receives if not r)
    assert empty == 0, f"{empty} receives came back empty while other queues held messages"
    assert elapsed < LONG_POLLING_S, f"draining 60 messages took {elapsed:.1f} s"
    assert seen == {g: list(range(20)) for g in groups}  # all, once each, in order
    # The queues holding messages take turns, however many empty queues lie between them.
    windows = [set.union(*receives[i : i + 3]) for i in range(len(receives) - 2)]
    assert all(len(w) == 3 for w in windows), f"groups served per receive: {receives}"


def test_a_redelivered_message_comes_back_before_any_later_one_of_its_group(broker, fifo):
    a, b = groups_in_distinct_queues(2)
    send_fifo(broker, "Fifo", [(a, 0), (a, 1), (a, 2), (b, 0), (b, 1), (b, 2)])
    first = fifo.receive(32, 2)
    # One receive takes from both queues, whichever queue the client aimed it at.
    assert sorted(parsed(m) for m in first) == [(a, 0), (a, 1), (a, 2), (b, 0), (b, 1), (b, 2)]
    by_key = {parsed(m): m for m in first}
    for key in [(a, 0), (b, 0), (b, 1), (b, 2)]:
        fifo.ack(by_key[key])
    send_fifo(broker, "Fifo", [(a, 3)])  # a later message waits behind a1 and a2
    # a1 and a2 were not acknowledged: once invisible no more, they come back, a3 does not.
    again = fifo.receive(32, 2)
    assert [(parsed(m), m.delivery_attempt) for m in again] == [((a, 1), 2), ((a, 2), 2)]
    fifo.ack(again[0])
    fifo.change_invisible_duration(again[1], 0)  # a nack: a2 is due again at once
    third = fifo.receive(32, 2)
    assert [(parsed(m), m.delivery_attempt) for m in third] == [((a, 2), 3)]
    fifo.ack(third[0])
    last = fifo.receive(32, 2)
    assert [(parsed(m), m.delivery_attempt) for m in last] == [((a, 3), 1)]
    fifo.ack(last[0])


def test_a_long_poll_on_an_empty_topic_wakes_on_an_arrival_in_any_queue(broker, fifo):
    [group] = groups_in_distinct_queues(1)
    # The client aims successive receives at successive queues, so at most one of the two
    # is aimed at the queue the message group lands in.
    for n in range(2):
        receiver = Receiver(fifo)
        wait_until(lambda: suspended_long_polls(broker) == 1, 10, "the receive to suspend")
        sent_at = time.monotonic()
        send_fifo(broker, "Fifo", [(group, n)])
        got = receiver.join()
        assert [parsed(m) for m in got] == [(group, n)]
        waited = receiver.returned_at - sent_at
        assert waited < LONG_POLLING_S / 2, f"receive {n} answered {waited:.1f} s after"
        fifo.ack(got[0])


def test_an_ack_that_frees_a_fifo_queue_wakes_a_waiting_receive(broker, fifo):
    [group] = groups_in_distinct_queues(1)
    send_fifo(broker, "Fifo", [(group, 0), (group, 1)])
    [first] = fifo.receive(1, 10)
    receiver = Receiver(fifo)  # nothing deliverable: m1 waits behind m0
    wait_until(lambda: suspended_long_polls(broker) == 1, 10, "the receive to suspend")
    acked_at = time.monotonic()
    fifo.ack(first)
    got = receiver.join()
    assert [parsed(m) for m in got] == [(group, 1)]
    waited = receiver.returned_at - acked_at
    assert waited < LONG_POLLING_S / 2, f"the receive answered {waited:.1f} s after the ack"
