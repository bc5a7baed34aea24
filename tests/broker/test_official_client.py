"""The official rocketmq-python-client 5.1.2 against a real broker process."""

from __future__ import annotations

import threading
import time

import pytest
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
)

from tests.broker.broker_process import BrokerProcess
from tests.waiting import wait_until

# How long past a deadline (an invisible time running out) a test watches for a message that
# must not come: nothing signals that something did not happen.
QUIET_S = 0.5


def config(broker: BrokerProcess) -> ClientConfiguration:
    return ClientConfiguration(broker.address, Credentials(), request_timeout=5)


def message(topic: str, body: bytes, tag: str | None = None, **extra: object) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    if tag:
        m.tag = tag
    for name, value in extra.items():
        setattr(m, name, value)
    return m


def produce(
    broker: BrokerProcess, topic: str, bodies: list[bytes], tag: str | None = None, **extra: object
) -> list[str]:
    producer = Producer(config(broker), (topic,))
    producer.startup()
    try:
        return [producer.send(message(topic, b, tag, **extra)).message_id for b in bodies]
    finally:
        producer.shutdown()


def receive_all(
    consumer: SimpleConsumer, want: int, invisible_s: int = 10, timeout_s: float = 20
) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got.extend(consumer.receive(32, invisible_s))
    return got


def test_send_then_simple_consumer_receives_acks_and_nothing_comes_back(broker):
    broker.create_topic("Orders")
    broker.create_group("G")
    ids = produce(broker, "Orders", [f"order {i}".encode() for i in range(50)], tag="A")
    consumer = SimpleConsumer(
        config(broker), "G", {"Orders": FilterExpression("*")}, await_duration=3
    )
    consumer.startup()
    try:
        got = receive_all(consumer, 50, invisible_s=2)
        assert sorted(m.message_id for m in got) == sorted(ids)
        assert all(m.tag == "A" and m.delivery_attempt == 1 for m in got)
        assert {m.body for m in got} == {f"order {i}".encode() for i in range(50)}
        for m in got:
            consumer.ack(m)
        time.sleep(2 + QUIET_S)  # past the invisible time: acknowledged messages must not return
        assert consumer.receive(32, 2) == []
    finally:
        consumer.shutdown()
    assert sum(broker.queue_ends("Orders")) == 50


def test_unacked_message_comes_back_with_the_next_delivery_attempt(broker):
    broker.create_topic("T")
    broker.create_group("G")
    [mid] = produce(broker, "T", [b"once"])
    consumer = SimpleConsumer(config(broker), "G", {"T": FilterExpression("*")}, await_duration=3)
    consumer.startup()
    try:
        [first] = receive_all(consumer, 1, invisible_s=1)
        assert first.delivery_attempt == 1
        started = time.monotonic()
        [second] = receive_all(consumer, 1, invisible_s=1)
        assert second.message_id == mid and second.delivery_attempt == 2
        assert time.monotonic() - started < 3
        consumer.ack(second)
        with pytest.raises(Exception, match=r"40013|INVALID_RECEIPT_HANDLE|receipt"):
            consumer.ack(first)  # its handle is stale now
    finally:
        consumer.shutdown()


def test_change_invisible_duration_delays_redelivery_and_issues_a_new_handle(broker):
    broker.create_topic("T")
    broker.create_group("G")
    produce(broker, "T", [b"slow work"])
    consumer = SimpleConsumer(config(broker), "G", {"T": FilterExpression("*")}, await_duration=2)
    consumer.startup()
    try:
        # The first invisible time leaves the change seconds to arrive in, however loaded the
        # machine: a change that comes after the message is visible again is too late.
        [m] = receive_all(consumer, 1, invisible_s=3)
        received = time.monotonic()
        old_handle = m.receipt_handle
        consumer.change_invisible_duration(m, 6)
        changed = time.monotonic()
        assert m.receipt_handle != old_handle
        time.sleep(max(0.0, received + 3 + QUIET_S - time.monotonic()))
        assert consumer.receive(32, 1) == []  # the original 3 s have run out by now
        consumer.ack(m)  # the new handle acknowledges
        time.sleep(max(0.0, changed + 6 + QUIET_S - time.monotonic()))
        assert consumer.receive(32, 1) == []  # past the new 6 s: acknowledged, it never returns
    finally:
        consumer.shutdown()


def test_tag_filter_delivers_only_matching_tags(broker):
    broker.create_topic("T")
    broker.create_group("G")
    produce(broker, "T", [b"a"], tag="TagA")
    produce(broker, "T", [b"b"], tag="TagB")
    produce(broker, "T", [b"c"], tag="TagC")
    consumer = SimpleConsumer(
        config(broker), "G", {"T": FilterExpression("TagA||TagC")}, await_duration=2
    )
    consumer.startup()
    try:
        got = receive_all(consumer, 2, timeout_s=6)
        time.sleep(0.2)
        got += consumer.receive(32, 10)
        assert sorted(m.body for m in got) == [b"a", b"c"]
    finally:
        consumer.shutdown()


def test_message_is_dead_lettered_after_max_attempts(broker):
    broker.create_topic("T")
    broker.create_group("G", max_attempts=2)
    [mid] = produce(broker, "T", [b"poison"])
    consumer = SimpleConsumer(config(broker), "G", {"T": FilterExpression("*")}, await_duration=2)
    consumer.startup()
    try:
        attempts = [m.delivery_attempt for m in receive_all(consumer, 1, invisible_s=1)]
        attempts += [m.delivery_attempt for m in receive_all(consumer, 1, invisible_s=1)]
        assert attempts == [1, 2]
        # Expired after the last attempt, the broker moves it to the DLQ, and only there.
        wait_until(lambda: broker.dead_letters("G") == 1, 10, "the message in the DLQ")
        assert consumer.receive(32, 1) == []
    finally:
        consumer.shutdown()
    broker.create_group("DlqReader")
    reader = SimpleConsumer(
        config(broker), "DlqReader", {"%DLQ%G": FilterExpression("*")}, await_duration=3
    )
    reader.startup()
    try:
        [dead] = receive_all(reader, 1, timeout_s=10)
        assert dead.message_id == mid and dead.body == b"poison"
    finally:
        reader.shutdown()


class Recorder(MessageListener):
    def __init__(self, fail_first: int = 0, fail_always: bool = False) -> None:
        self.lock = threading.Lock()
        self.seen: list[Message] = []
        self.fail_first = fail_first
        self.fail_always = fail_always

    def consume(self, message: Message) -> ConsumeResult:
        with self.lock:
            self.seen.append(message)
            attempts = sum(1 for m in self.seen if m.message_id == message.message_id)
        if self.fail_always or attempts <= self.fail_first:
            return ConsumeResult.FAILURE
        return ConsumeResult.SUCCESS


def wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_push_consumer_consumes_and_retries_failures_with_growing_attempts(broker):
    broker.create_topic("T")
    broker.create_group("G")
    ids = produce(broker, "T", [f"m{i}".encode() for i in range(20)])
    listener = Recorder(fail_first=1)  # each message fails once, then succeeds
    consumer = PushConsumer(config(broker), "G", listener, {"T": FilterExpression("*")})
    consumer.startup()
    try:
        assert wait_for(lambda: len(listener.seen) >= 40, 25), len(listener.seen)
    finally:
        consumer.shutdown()
    by_id: dict[str, list[int]] = {}
    for m in listener.seen:
        by_id.setdefault(m.message_id, []).append(m.delivery_attempt)
    assert set(by_id) == set(ids)
    assert all(sorted(a)[:2] == [1, 2] for a in by_id.values()), by_id


def test_push_consumer_failing_message_reaches_the_dlq(broker):
    broker.create_topic("T")
    broker.create_group("G", max_attempts=2)
    [mid] = produce(broker, "T", [b"always fails"])
    listener = Recorder(fail_always=True)
    consumer = PushConsumer(config(broker), "G", listener, {"T": FilterExpression("*")})
    consumer.startup()
    try:
        assert wait_for(lambda: len(listener.seen) >= 2, 20)
        wait_until(lambda: broker.dead_letters("G") == 1, 10, "the failure moving it to the DLQ")
    finally:
        consumer.shutdown()
    assert [m.delivery_attempt for m in listener.seen][:2] == [1, 2]
    broker.create_group("DlqReader")
    reader = SimpleConsumer(
        config(broker), "DlqReader", {"%DLQ%G": FilterExpression("*")}, await_duration=3
    )
    reader.startup()
    try:
        dead = receive_all(reader, 1, timeout_s=15)
        assert [m.message_id for m in dead] == [mid]
    finally:
        reader.shutdown()


def test_fifo_push_consumer_keeps_order_per_message_group(broker):
    broker.create_topic("Fifo", kind="FIFO", queues=4)
    broker.create_group("G", fifo=True)
    producer = Producer(config(broker), ("Fifo",))
    producer.startup()
    try:
        for i in range(30):
            for group in ("g1", "g2", "g3"):
                producer.send(message("Fifo", f"{group}:{i}".encode(), message_group=group))
    finally:
        producer.shutdown()
    listener = Recorder()
    consumer = PushConsumer(
        config(broker), "G", listener, {"Fifo": FilterExpression("*")}, consumption_thread_count=8
    )
    consumer.startup()
    try:
        assert wait_for(lambda: len(listener.seen) >= 90, 30), len(listener.seen)
    finally:
        consumer.shutdown()
    for group in ("g1", "g2", "g3"):
        order = [
            int(m.body.split(b":")[1]) for m in listener.seen if m.body.startswith(group.encode())
        ]
        assert order == list(range(30)), (group, order)


def test_delay_message_is_never_early_and_at_most_a_second_late(broker):
    broker.create_topic("Later", kind="DELAY")
    broker.create_group("G")
    consumer = SimpleConsumer(
        config(broker), "G", {"Later": FilterExpression("*")}, await_duration=5
    )
    producer = Producer(config(broker), ("Later",))
    # Both clients are up before the message is sent: what is measured is the broker's
    # timing, not how long a client takes to start on a loaded machine.
    consumer.startup()
    producer.startup()
    try:
        due_s = int(time.time()) + 3  # the timestamp is in whole seconds
        producer.send(message("Later", b"later", delivery_timestamp=due_s))
        got = receive_all(consumer, 1, timeout_s=10)
        arrived = time.time()
    finally:
        producer.shutdown()
        consumer.shutdown()
    assert [m.body for m in got] == [b"later"]
    assert due_s <= arrived < due_s + 1.5


@pytest.mark.parametrize("creates_groups", [False, True])
def test_a_consumer_group_nobody_declared_is_refused_unless_the_broker_creates_groups(
    tmp_path, creates_groups
):
    """RocketMQ's autoCreateSubscriptionGroup, here `auto_create_group` (a BrokerGroup's
    `spec.brokerConfig`): off, an undeclared group is refused NOT_FOUND (40403); on, the
    official SimpleConsumer's first receive makes it and it consumes."""
    broker = BrokerProcess(tmp_path, auto_create_group=creates_groups).start()
    try:
        broker.create_topic("T")
        [mid] = produce(broker, "T", [b"to whoever asks"])
        consumer = SimpleConsumer(
            config(broker), "Undeclared", {"T": FilterExpression("*")}, await_duration=2
        )
        consumer.startup()
        try:
            if not creates_groups:
                with pytest.raises(Exception, match=r"40403|not found"):
                    consumer.receive(32, 10)
                return
            [got] = receive_all(consumer, 1)
            assert got.message_id == mid
            consumer.ack(got)
        finally:
            consumer.shutdown()
        broker.stop()
        # Made once, it is a declared group: the same store under a broker that makes no
        # groups still serves it (a receive answers, with nothing left to receive).
        broker = BrokerProcess(tmp_path).start()
        assert receive_all_after_restart(broker) == []
    finally:
        broker.stop()


def receive_all_after_restart(broker: BrokerProcess) -> list[Message]:
    """What the group `Undeclared` still has to receive of topic T (nothing once acked)."""
    consumer = SimpleConsumer(
        config(broker), "Undeclared", {"T": FilterExpression("*")}, await_duration=2
    )
    consumer.startup()
    try:
        return consumer.receive(32, 10)
    finally:
        consumer.shutdown()
