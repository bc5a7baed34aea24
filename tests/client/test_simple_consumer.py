"""The SDK's SimpleConsumer against a real broker: what is acknowledged never comes again,
what is not comes back with its attempt counted once its invisible time is up, and more
time can be asked for; a bad receipt handle is a clear refusal."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from capstan.client.consumer.simple_consumer import PoppedMessage, SimpleConsumer
from capstan.client.errors import ClientError
from capstan.client.message import Message
from capstan.client.producer import Producer
from tests.broker.broker_process import BrokerProcess


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("simple")).start()
    yield process
    process.stop()


def receive_all(consumer: SimpleConsumer, want: int, invisible_s: float) -> list[PoppedMessage]:
    got: list[PoppedMessage] = []
    deadline = time.monotonic() + 20
    while len(got) < want and time.monotonic() < deadline:
        got += consumer.receive(want - len(got), invisible_s, wait_s=2)
    return got


def test_acknowledged_messages_are_gone_and_the_others_come_back(broker: BrokerProcess):
    broker.create_topic("Simple", queues=2)
    broker.create_group("SG")
    with Producer(broker.address) as producer:
        for body in (b"a", b"b", b"c"):
            producer.send(Message("Simple", body, tag="t"))
    with SimpleConsumer(broker.address, "SG", "Simple") as consumer:
        assert len(consumer.broker_groups()) == 1  # a broker alone is one group
        first = receive_all(consumer, 3, invisible_s=2)
        assert sorted(m.message.body for m in first) == [b"a", b"b", b"c"]
        assert {m.delivery_attempt for m in first} == {1}
        assert {m.message.tag for m in first} == {"t"}
        kept = next(m for m in first if m.message.body == b"c")
        for m in first:
            if m is not kept:
                consumer.ack(m)
        # Not acknowledged in time: it comes again, its attempt counted; nothing else does.
        again = receive_all(consumer, 1, invisible_s=30)
        assert [(m.message.body, m.delivery_attempt) for m in again] == [(b"c", 2)]
        # More time: the new handle acknowledges it, and it never comes back.
        extended = consumer.change_invisible_duration(again[0], 60)
        assert extended != again[0].receipt_handle
        consumer.ack(_with_handle(again[0], extended))
        assert consumer.receive(8, invisible_s=1, wait_s=3) == []


def test_an_ack_with_a_forged_handle_is_refused(broker: BrokerProcess):
    broker.create_topic("Forged", queues=1)
    broker.create_group("FG")
    with Producer(broker.address) as producer:
        producer.send(Message("Forged", b"x"))
    with SimpleConsumer(broker.address, "FG", "Forged") as consumer:
        (m,) = receive_all(consumer, 1, invisible_s=30)
        with pytest.raises(ClientError) as refused:
            consumer.ack(_with_handle(m, m.receipt_handle[:-4] + "AAAA"))
        assert not refused.value.retriable
        consumer.ack(m)


def _with_handle(m: PoppedMessage, handle: str) -> PoppedMessage:
    return PoppedMessage(
        m.message, m.broker_name, m.queue_id, m.queue_offset, m.delivery_attempt, handle
    )
