"""Compressed bodies: a producer may send a body gzip-compressed (body_encoding GZIP). The
broker keeps it as sent, marks it compressed, and tells every consumer so, whichever way
the message travels (straight, through the timer, through a retry)."""

from __future__ import annotations

import gzip
import time
import zlib

import pytest
from rocketmq import FilterExpression, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.received_message import ReceivedMessage
from tests.broker.test_batch_pull import pull, puller
from tests.broker.test_official_client import config, receive_all
from tests.broker.v2_requests import now_ms, receive, send, stub, v2_message

ORIGINAL = b"a body worth compressing " * 400


@pytest.fixture
def b(broker):
    broker.create_topic("T", queues=1)
    broker.create_topic("Later", kind="DELAY", queues=1)
    broker.create_group("G")
    return broker


def test_a_gzip_body_reaches_the_official_client_inflated(b):
    packed = gzip.compress(ORIGINAL)
    reply = send(stub(b.address), v2_message("T", packed, body_encoding=pb.GZIP))
    assert reply.status.code == pb.OK

    status, [raw] = receive(stub(b.address), "G", "T", invisible_ms=1000)
    assert status.code == pb.OK
    assert raw.system_properties.body_encoding == pb.GZIP
    assert raw.body == packed  # stored as sent; the digest is over what travels
    assert raw.system_properties.body_digest.checksum == f"{zlib.crc32(packed):08X}"

    consumer = SimpleConsumer(config(b), "G", {"T": FilterExpression("*")}, await_duration=3)
    consumer.startup()
    try:
        [redelivered] = receive_all(consumer, 1)  # the first receive's 1 s ran out
        assert redelivered.body == ORIGINAL
        assert redelivered.delivery_attempt == 2
        consumer.ack(redelivered)
    finally:
        consumer.shutdown()


def test_an_identity_body_stays_identity(b):
    send(stub(b.address), v2_message("T", b"plain", body_encoding=pb.IDENTITY))
    send(stub(b.address), v2_message("T", b"unspecified", body_encoding=pb.ENCODING_UNSPECIFIED))
    _, got = receive(stub(b.address), "G", "T")
    assert {m.body for m in got} == {b"plain", b"unspecified"}
    assert {m.system_properties.body_encoding for m in got} == {pb.IDENTITY}


def test_a_delayed_gzip_body_is_still_marked_after_the_timer(b):
    packed = gzip.compress(ORIGINAL)
    message = v2_message(
        "Later",
        packed,
        body_encoding=pb.GZIP,
        message_type=pb.DELAY,
        delivery_timestamp_ms=now_ms() + 1000,
    )
    assert send(stub(b.address), message).status.code == pb.OK
    deadline = time.monotonic() + 10
    got: list[pb.Message] = []
    while not got and time.monotonic() < deadline:
        _, got = receive(stub(b.address), "G", "Later", wait_ms=1000)
    [delivered] = got
    assert delivered.system_properties.body_encoding == pb.GZIP
    assert gzip.decompress(delivered.body) == ORIGINAL


def test_the_sdk_inflates_a_pulled_compressed_body(b):
    send(stub(b.address), v2_message("T", gzip.compress(ORIGINAL), body_encoding=pb.GZIP))
    send(stub(b.address), v2_message("T", b"plain"))
    reply = pull(puller(b.address), 0)
    views = [ReceivedMessage(m, MessageQueue("T", "broker-a", 0)) for m in reply.messages]
    assert [v.body for v in views] == [ORIGINAL, b"plain"]


def test_an_unknown_body_encoding_is_refused_and_nothing_is_stored(b):
    reply = send(stub(b.address), v2_message("T", b"x", body_encoding=7))
    assert reply.status.code == pb.BAD_REQUEST
    assert "body_encoding" in reply.status.message
    assert b.queue_ends("T") == [0]
