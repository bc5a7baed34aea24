"""The offset-based pull API (v2 PullMessage, UpdateOffset, GetOffset, QueryOffset)."""

from __future__ import annotations

import threading
import time

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.broker.v2_requests import METADATA, ms, send, stub, v2_message


def queue(topic: str, qid: int) -> pb.MessageQueue:
    return pb.MessageQueue(topic=pb.Resource(name=topic), id=qid)


def pull(
    s,
    topic: str,
    qid: int,
    offset: int,
    wait_ms: int = 0,
    group: str = "G",
    tags: str = "*",
):
    request = svc.PullMessageRequest(
        group=pb.Resource(name=group),
        message_queue=queue(topic, qid),
        offset=offset,
        batch_size=32,
        filter_expression=pb.FilterExpression(type=pb.TAG, expression=tags),
        long_polling_timeout=ms(wait_ms),
    )
    status, messages, next_offset = None, [], None
    for r in s.PullMessage(request, metadata=METADATA, timeout=wait_ms / 1000 + 5):
        kind = r.WhichOneof("content")
        if kind == "status":
            status = r.status
        elif kind == "message":
            messages.append(r.message)
        else:
            next_offset = r.next_offset
    return status, messages, next_offset


@pytest.fixture
def b(broker):
    broker.create_topic("T", queues=1)
    broker.create_group("G")
    return broker


def test_pull_walks_the_queue_by_offset(b):
    s = stub(b.address)
    for i in range(40):
        send(s, v2_message("T", f"m{i}".encode(), tag="even" if i % 2 == 0 else "odd"))
    status, got, nxt = pull(s, "T", 0, 0)
    assert status.code == pb.OK and len(got) == 32 and nxt == 32
    assert [m.system_properties.queue_offset for m in got] == list(range(32))
    status, got, nxt = pull(s, "T", 0, 32)
    assert len(got) == 8 and nxt == 40
    status, got, nxt = pull(s, "T", 0, 0, tags="odd")
    assert all(m.system_properties.tag == "odd" for m in got) and got


def test_pull_at_the_end_suspends_and_wakes_when_a_message_arrives(b):
    s = stub(b.address)
    timer = threading.Timer(1.0, lambda: send(stub(b.address), v2_message("T", b"late")))
    timer.start()
    started = time.monotonic()
    status, got, nxt = pull(s, "T", 0, 0, wait_ms=10_000)
    assert status.code == pb.OK
    waited = time.monotonic() - started
    assert [m.body for m in got] == [b"late"] and nxt == 1
    assert 0.9 <= waited < 3  # woke on arrival, not at the 10 s timeout


def test_pull_with_nothing_new_times_out_with_message_not_found(b):
    status, got, nxt = pull(stub(b.address), "T", 0, 0, wait_ms=500)
    assert status.code == pb.MESSAGE_NOT_FOUND and got == [] and nxt == 0


def test_pull_beyond_the_end_is_an_illegal_offset(b):
    s = stub(b.address)
    send(s, v2_message("T"))
    status, got, nxt = pull(s, "T", 0, 50)
    assert status.code == pb.ILLEGAL_OFFSET and got == [] and nxt == 1


def test_offsets_update_get_and_query(b):
    s = stub(b.address)
    for _ in range(5):
        send(s, v2_message("T"))
        time.sleep(0.01)
    get = s.GetOffset(
        svc.GetOffsetRequest(group=pb.Resource(name="G"), message_queue=queue("T", 0)),
        metadata=METADATA,
        timeout=5,
    )
    assert get.status.code == pb.OFFSET_NOT_FOUND
    upd = s.UpdateOffset(
        svc.UpdateOffsetRequest(group=pb.Resource(name="G"), message_queue=queue("T", 0), offset=3),
        metadata=METADATA,
        timeout=5,
    )
    assert upd.status.code == pb.OK
    get = s.GetOffset(
        svc.GetOffsetRequest(group=pb.Resource(name="G"), message_queue=queue("T", 0)),
        metadata=METADATA,
        timeout=5,
    )
    assert (get.status.code, get.offset) == (pb.OK, 3)
    too_far = s.UpdateOffset(
        svc.UpdateOffsetRequest(
            group=pb.Resource(name="G"), message_queue=queue("T", 0), offset=99
        ),
        metadata=METADATA,
        timeout=5,
    )
    assert too_far.status.code == pb.ILLEGAL_OFFSET

    def query(policy, stamp_ms=0):
        request = svc.QueryOffsetRequest(message_queue=queue("T", 0), query_offset_policy=policy)
        request.timestamp.FromMilliseconds(stamp_ms)
        return s.QueryOffset(request, metadata=METADATA, timeout=5).offset

    assert query(pb.BEGINNING) == 0
    assert query(pb.END) == 5
    assert query(pb.TIMESTAMP, time.time_ns() // 1_000_000 + 60_000) == 5
    assert query(pb.TIMESTAMP, 0) == 0
