"""capstan.v1.Pull PullMessages: a batch of one queue per call, RocketMQ's pull statuses."""

from __future__ import annotations

import threading
import time
import zlib

import grpc
import pytest

from capstan.v1 import pull_pb2 as v1
from capstan.v1 import pull_pb2_grpc as v1_grpc
from tests.broker.broker_process import open_channel
from tests.broker.v2_requests import send, stub, v2_message


def puller(address: str, here: bool = False) -> v1_grpc.PullStub:
    return v1_grpc.PullStub(open_channel(address, here))  # type: ignore[no-untyped-call]


def pull(
    p: v1_grpc.PullStub,
    offset: int,
    max_messages: int = 32,
    *,
    topic: str = "T",
    queue_id: int = 0,
    group: str = "G",
    tags: str = "*",
    wait_ms: int = 0,
) -> v1.PullMessagesResponse:
    request = v1.PullMessagesRequest(
        group=group,
        topic=topic,
        queue_id=queue_id,
        offset=offset,
        max_messages=max_messages,
        tag_expression=tags,
        long_polling_ms=wait_ms,
    )
    return p.PullMessages(request, timeout=wait_ms / 1000 + 10)


@pytest.fixture
def b(broker):
    broker.create_topic("T", queues=1)
    broker.create_group("G")
    return broker


def test_a_batch_carries_each_message_as_sent_in_queue_order(b):
    s = stub(b.address)
    sent = [
        v2_message("T", f"body-{i}".encode(), tag="even" if i % 2 == 0 else "odd", keys=[f"k{i}"])
        for i in range(40)
    ]
    for m in sent:
        send(s, m)
    p = puller(b.address)

    first = pull(p, 0)
    assert first.status == v1.FOUND
    assert (first.next_begin_offset, first.min_offset, first.max_offset) == (32, 0, 40)
    assert [m.queue_offset for m in first.messages] == list(range(32))
    for got, m in zip(first.messages, sent, strict=False):
        assert got.message_id == m.system_properties.message_id
        assert got.body == m.body
        assert got.body_crc == zlib.crc32(m.body)
        assert got.properties["TAGS"] == m.system_properties.tag
        assert got.properties["KEYS"] == m.system_properties.keys[0]
        assert got.queue_id == 0 and got.commit_log_offset >= 0
        assert got.store_timestamp_ms >= got.born_timestamp_ms > 0
        assert got.store_host.endswith(f":{b.port}")

    rest = pull(p, first.next_begin_offset)
    assert [m.body for m in rest.messages] == [m.body for m in sent[32:]]
    assert rest.next_begin_offset == 40
    end = pull(p, 40)
    assert end.status == v1.NO_NEW_MSG and not end.messages and end.next_begin_offset == 40


def test_tag_filter_returns_only_matching_messages_and_says_when_none_matched(b):
    s = stub(b.address)
    for i in range(10):
        send(s, v2_message("T", f"m{i}".encode(), tag="a" if i < 8 else "b"))
    p = puller(b.address)
    only_b = pull(p, 0, tags="b||c")
    assert [m.body for m in only_b.messages] == [b"m8", b"m9"]
    assert only_b.next_begin_offset == 10
    none = pull(p, 0, max_messages=4, tags="c")
    assert none.status == v1.NO_MATCHED_MSG and not none.messages
    assert none.next_begin_offset > 0  # skipped what it scanned: the client moves on


def test_max_messages_and_offsets_outside_the_queue(b):
    s = stub(b.address)
    for i in range(5):
        send(s, v2_message("T", f"m{i}".encode()))
    p = puller(b.address)
    two = pull(p, 1, max_messages=2)
    assert [m.queue_offset for m in two.messages] == [1, 2] and two.next_begin_offset == 3
    beyond = pull(p, 99)
    assert beyond.status == v1.OFFSET_ILLEGAL and beyond.next_begin_offset == 5


def test_at_the_end_a_pull_waits_and_answers_the_moment_a_message_arrives(b):
    p = puller(b.address)
    timer = threading.Timer(1.0, lambda: send(stub(b.address), v2_message("T", b"late")))
    timer.start()
    started = time.monotonic()
    got = pull(p, 0, wait_ms=10_000)
    waited = time.monotonic() - started
    timer.join()
    assert got.status == v1.FOUND and [m.body for m in got.messages] == [b"late"]
    assert 0.9 <= waited < 3  # woke on arrival, not at the 10 s limit

    started = time.monotonic()
    idle = pull(p, 1, wait_ms=300)
    assert idle.status == v1.NO_NEW_MSG
    assert 0.25 <= time.monotonic() - started < 3


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"group": "Nobody"}, grpc.StatusCode.NOT_FOUND),
        ({"topic": "NoSuchTopic"}, grpc.StatusCode.NOT_FOUND),
        ({"queue_id": 7}, grpc.StatusCode.NOT_FOUND),
        ({"max_messages": 0}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"max_messages": 5000}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"offset": -1}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"tags": "a|| ||b"}, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_bad_pulls_get_a_clear_grpc_error(b, change, code):
    p = puller(b.address)
    args = {"offset": 0, "max_messages": 8, **change}
    with pytest.raises(grpc.RpcError) as caught:
        pull(p, **args)
    assert caught.value.code() == code
    assert caught.value.details()
