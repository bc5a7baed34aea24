"""RecallMessage: a delayed message cancelled with the recall handle its send returned is
never delivered, not even after a kill -9 and a restart; everything else still is."""

from __future__ import annotations

import time

import pytest
from rocketmq import FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.broker.test_official_client import config, message, receive_all
from tests.broker.v2_requests import METADATA, ack, now_ms, receive, send, stub, v2_message


@pytest.fixture
def b(broker):
    broker.create_topic("Later", kind="DELAY", queues=2)
    broker.create_topic("Other", kind="DELAY", queues=1)
    broker.create_group("G")
    return broker


def recall(address: str, topic: str, handle: str) -> svc.RecallMessageResponse:
    request = svc.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=handle)
    return stub(address).RecallMessage(request, metadata=METADATA, timeout=10)


def delayed(topic: str, body: bytes, in_ms: int) -> pb.Message:
    return v2_message(topic, body, message_type=pb.DELAY, delivery_timestamp_ms=now_ms() + in_ms)


def bodies_within(address: str, topic: str, seconds: float) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        _, messages = receive(stub(address), "G", topic, wait_ms=500)
        for m in messages:
            got.append(m.body)
            ack(stub(address), "G", topic, m.system_properties.receipt_handle)
    return got


def test_the_official_producer_recalls_a_delayed_message(b):
    producer = Producer(config(b), ("Later",))
    producer.startup()
    try:
        due_s = int(time.time()) + 3
        kept = producer.send(message("Later", b"kept", delivery_timestamp=due_s))
        gone = producer.send(message("Later", b"recalled", delivery_timestamp=due_s))
        assert gone.recall_handle and kept.recall_handle
        assert producer.recall_message("Later", gone.recall_handle) == gone.message_id
        assert producer.recall_message("Later", gone.recall_handle) == gone.message_id  # again
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config(b), "G", {"Later": FilterExpression("*")}, await_duration=2)
    consumer.startup()
    try:
        got = receive_all(consumer, 2, timeout_s=7)  # asks for two; only one may come
    finally:
        consumer.shutdown()
    assert [m.body for m in got] == [b"kept"]


def test_a_delivered_message_cannot_be_recalled(b):
    reply = send(stub(b.address), delayed("Later", b"soon", 300))
    [entry] = reply.entries
    assert bodies_within(b.address, "Later", 2) == [b"soon"]
    answer = recall(b.address, "Later", entry.recall_handle)
    assert answer.status.code == pb.MESSAGE_NOT_FOUND
    assert answer.message_id == entry.message_id


def test_only_messages_parked_in_the_timer_get_a_recall_handle(b):
    b.create_topic("Now", queues=1)
    [normal] = send(stub(b.address), v2_message("Now", b"normal")).entries
    [past] = send(stub(b.address), delayed("Later", b"due already", -1000)).entries
    assert normal.recall_handle == "" and past.recall_handle == ""


@pytest.mark.parametrize(
    "forge",
    [
        lambda h: h[:-1] + ("0" if h[-1] != "0" else "1"),  # the tag changed
        lambda h: h.replace("r1.", "r1.1", 1),  # the offset changed
        lambda h: h + "é",  # not ASCII
        lambda h: "",
        lambda h: "r1.zz.zz.x.00",
    ],
)
def test_a_forged_or_malformed_handle_is_refused_and_recalls_nothing(b, forge):
    [entry] = send(stub(b.address), delayed("Later", b"still due", 1500)).entries
    answer = recall(b.address, "Later", forge(entry.recall_handle))
    assert answer.status.code == pb.BAD_REQUEST
    assert bodies_within(b.address, "Later", 3.5) == [b"still due"]


def test_a_handle_is_only_good_for_its_own_topic(b):
    [entry] = send(stub(b.address), delayed("Later", b"x", 1500)).entries
    assert recall(b.address, "Other", entry.recall_handle).status.code == pb.BAD_REQUEST
    missing = recall(b.address, "Nowhere", entry.recall_handle)
    assert missing.status.code == pb.TOPIC_NOT_FOUND


def test_a_recall_survives_kill_9_and_restart(b):
    s = stub(b.address)
    first = send(s, delayed("Later", b"first", 4000)).entries[0]
    gone = send(s, delayed("Later", b"recalled", 4000)).entries[0]
    last = send(s, delayed("Later", b"last", 4000)).entries[0]
    assert recall(b.address, "Later", gone.recall_handle).status.code == pb.OK
    b.kill9()
    b.start()
    assert sorted(bodies_within(b.address, "Later", 6.5)) == [b"first", b"last"]
    assert first.recall_handle != last.recall_handle
    # after the restart the recall still answers (the marker was read back), and a
    # delivered message still cannot be recalled
    assert recall(b.address, "Later", last.recall_handle).status.code == pb.MESSAGE_NOT_FOUND
