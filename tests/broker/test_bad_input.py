"""Every bad request gets its v2 status code and changes nothing."""

from __future__ import annotations

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.broker.v2_requests import (
    METADATA,
    ack,
    change_invisible,
    now_ms,
    receive,
    send,
    send_to_queue,
    stub,
    v2_message,
)

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def b(shared_broker):
    shared_broker.create_topic("Plain", queues=2)
    shared_broker.create_topic("Ordered", kind="FIFO", queues=2)
    shared_broker.create_topic("Mixed", kind="MIXED", queues=2)
    shared_broker.create_group("G")
    return shared_broker


def assert_send_refused(b, code: int, *messages: pb.Message) -> None:
    before = b.queue_ends("Plain")
    reply = send(stub(b.address), *messages)
    assert reply.status.code == code, reply.status
    assert [e.status.code for e in reply.entries] == [code] * len(messages)
    assert b.queue_ends("Plain") == before


@pytest.mark.parametrize(
    ("message", "code"),
    [
        (v2_message("bad topic!"), pb.ILLEGAL_TOPIC),
        (v2_message(""), pb.ILLEGAL_TOPIC),
        (v2_message("Missing"), pb.TOPIC_NOT_FOUND),
        (v2_message("Plain", b""), pb.MESSAGE_BODY_EMPTY),
        (v2_message("Plain", b"x" * (4 * MIB + 1)), pb.MESSAGE_BODY_TOO_LARGE),
        (v2_message("Plain", tag="a|b"), pb.ILLEGAL_MESSAGE_TAG),
        (v2_message("Plain", tag="bad\ntag"), pb.ILLEGAL_MESSAGE_TAG),
        (v2_message("Plain", tag="  "), pb.ILLEGAL_MESSAGE_TAG),
        (
            v2_message("Plain", message_group="g", message_type=pb.FIFO),
            pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
        ),
        (v2_message("Plain", message_type=pb.TRANSACTION), pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (v2_message("Plain", message_type=pb.FIFO), pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        (v2_message("Plain", message_id=""), pb.ILLEGAL_MESSAGE_ID),
        (v2_message("Plain", keys=["has space"]), pb.ILLEGAL_MESSAGE_KEY),
    ],
    ids=lambda v: str(v) if isinstance(v, int) else None,
)
def test_bad_message_is_refused_with_its_code(b, message, code):
    assert_send_refused(b, code, message)


def test_delay_beyond_a_day_is_refused(b):
    b.create_topic("Later", kind="DELAY")
    reply = send(
        stub(b.address),
        v2_message("Later", message_type=pb.DELAY, delivery_timestamp_ms=now_ms() + 2 * 86_400_000),
    )
    assert reply.status.code == pb.ILLEGAL_DELIVERY_TIME
    assert b.queue_ends("SCHEDULE_TOPIC_XXXX") == [0]


def test_reserved_property_is_refused(b):
    m = v2_message("Plain")
    m.user_properties["REAL_TOPIC"] = "Other"
    assert_send_refused(b, pb.ILLEGAL_MESSAGE_PROPERTY_KEY, m)


def test_one_bad_message_fails_the_whole_batch(b):
    assert_send_refused(b, pb.MESSAGE_BODY_EMPTY, v2_message("Plain"), v2_message("Plain", b""))


@pytest.mark.parametrize("named", ["2", "-1", "x", "", " 1", "1" * 40])
def test_a_named_queue_the_topic_lacks_refuses_the_whole_request(b, named):
    before = b.queue_ends("Plain")
    two = v2_message("Plain"), v2_message("Plain")
    reply, trailing = send_to_queue(stub(b.address), named, *two)
    assert reply.status.code == pb.BAD_REQUEST, reply.status
    assert [e.status.code for e in reply.entries] == [pb.BAD_REQUEST] * 2
    assert "x-capstan-queue-ids" not in trailing
    assert b.queue_ends("Plain") == before


def test_fifo_topic_refuses_a_message_without_a_group(b):
    reply = send(stub(b.address), v2_message("Ordered"))
    assert reply.status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    assert b.queue_ends("Ordered") == [0, 0]


@pytest.mark.parametrize(
    ("group", "topic", "invisible_ms", "code"),
    [
        ("bad group!", "Plain", 5000, pb.ILLEGAL_CONSUMER_GROUP),
        ("NoSuchGroup", "Plain", 5000, pb.CONSUMER_GROUP_NOT_FOUND),
        ("G", "NoSuchTopic", 5000, pb.TOPIC_NOT_FOUND),
        ("G", "Plain", 10, pb.ILLEGAL_INVISIBLE_TIME),
        ("G", "Plain", 13 * 3_600_000, pb.ILLEGAL_INVISIBLE_TIME),
        ("G", "Plain", None, pb.ILLEGAL_INVISIBLE_TIME),
    ],
)
def test_bad_receive_is_refused(b, group, topic, invisible_ms, code):
    status, messages = receive(stub(b.address), group, topic, invisible_ms=invisible_ms)
    assert (status.code, messages) == (code, [])


def test_sql_filter_is_refused(b):
    s = stub(b.address)
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name="G"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="Plain"), id=-1),
        filter_expression=pb.FilterExpression(type=pb.SQL, expression="a > 1"),
        batch_size=1,
    )
    request.invisible_duration.FromSeconds(5)
    [only] = list(s.ReceiveMessage(request, metadata=METADATA, timeout=10))
    assert only.status.code == pb.ILLEGAL_FILTER_EXPRESSION


def test_forged_and_stale_receipt_handles_are_refused(b):
    b.create_topic("Handles", queues=1)
    s = stub(b.address)
    send(s, v2_message("Handles", b"one"))
    _, [m] = receive(s, "G", "Handles", invisible_ms=60_000)
    handle = m.system_properties.receipt_handle
    forged = handle[:-4] + ("0000" if not handle.endswith("0000") else "1111")
    assert ack(s, "G", "Handles", forged).status.code == pb.INVALID_RECEIPT_HANDLE
    assert ack(s, "G", "Handles", "garbage").status.code == pb.INVALID_RECEIPT_HANDLE
    not_ascii = handle[:-1] + "é"  # hmac.compare_digest refuses such str outright
    assert ack(s, "G", "Handles", not_ascii).status.code == pb.INVALID_RECEIPT_HANDLE
    assert change_invisible(s, "G", "Handles", not_ascii, 5000).status.code == (
        pb.INVALID_RECEIPT_HANDLE
    )
    assert ack(s, "Other", "Handles", handle).status.code in (
        pb.CONSUMER_GROUP_NOT_FOUND,
        pb.INVALID_RECEIPT_HANDLE,
    )
    bad_time = change_invisible(s, "G", "Handles", handle, -5)
    assert bad_time.status.code == pb.ILLEGAL_INVISIBLE_TIME
    assert bad_time.receipt_handle == handle  # the client keeps what comes back
    renewed = change_invisible(s, "G", "Handles", handle, 60_000)
    assert renewed.status.code == pb.OK and renewed.receipt_handle != handle
    assert ack(s, "G", "Handles", handle).status.code == pb.INVALID_RECEIPT_HANDLE  # stale
    assert ack(s, "G", "Handles", renewed.receipt_handle).status.code == pb.OK
    assert ack(s, "G", "Handles", renewed.receipt_handle).status.code == pb.INVALID_RECEIPT_HANDLE


def test_unknown_or_blank_transaction_id_is_refused(b):
    s = stub(b.address)
    ops_before = b.queue_ends("RMQ_SYS_TRANS_OP_HALF_TOPIC")
    for tx_id, code in (
        ("", pb.INVALID_TRANSACTION_ID),
        ("1-2", pb.INVALID_TRANSACTION_ID),
        ("nonsense", pb.INVALID_TRANSACTION_ID),
    ):
        reply = s.EndTransaction(
            svc.EndTransactionRequest(
                topic=pb.Resource(name="Plain"),
                message_id="01AB",
                transaction_id=tx_id,
                resolution=pb.COMMIT,
            ),
            metadata=METADATA,
            timeout=10,
        )
        assert reply.status.code == code, tx_id
    assert b.queue_ends("RMQ_SYS_TRANS_OP_HALF_TOPIC") == ops_before


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        (v2_message("Mixed", b"", message_type=pb.TRANSACTION), pb.MESSAGE_BODY_EMPTY),
        (
            v2_message("Mixed", b"x" * (4 * MIB + 1), message_type=pb.FIFO, message_group="g"),
            pb.MESSAGE_BODY_TOO_LARGE,
        ),
    ],
    ids=["empty-half-message", "too-large-fifo"],
)
def test_a_bad_message_of_any_type_fails_a_mixed_batch_before_any_part_is_stored(b, bad, code):
    """Normal, delayed and transactional messages go to three different places; the
    store's admission checks them all before any of them is stored."""
    before = b.queue_ends("Mixed"), b.queue_ends("SCHEDULE_TOPIC_XXXX")
    later = now_ms() + 60_000
    batch = (
        v2_message("Mixed"),
        v2_message("Mixed", message_type=pb.DELAY, delivery_timestamp_ms=later),
        bad,
    )
    reply = send(stub(b.address), *batch)
    assert reply.status.code == code, reply.status
    assert [e.status.code for e in reply.entries] == [code] * 3
    assert (b.queue_ends("Mixed"), b.queue_ends("SCHEDULE_TOPIC_XXXX")) == before
