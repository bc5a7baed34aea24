"""SendMessage with Capstan's queue metadata: the queue the SDK names is the queue used,
and every successful answer says where each message went."""

from __future__ import annotations

import zlib
from collections import Counter

from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.broker.edge.v2 import send as broker_send
from capstan.client.producer import producer as sdk_producer
from tests.broker.v2_requests import send_to_queue, stub, v2_message


def test_broker_and_sdk_agree_on_the_metadata_names():
    assert broker_send.QUEUE_ID_METADATA == sdk_producer.QUEUE_ID_METADATA
    assert broker_send.STORED_QUEUES_METADATA == sdk_producer.STORED_QUEUES_METADATA


def test_every_message_of_a_request_goes_to_the_named_queue(shared_broker):
    shared_broker.create_topic("Named", queues=4)
    messages = [v2_message("Named", f"m{i}".encode()) for i in range(3)]
    reply, trailing = send_to_queue(stub(shared_broker.address), "2", *messages)
    assert reply.status.code == pb.OK, reply.status
    assert [e.offset for e in reply.entries] == [0, 1, 2]
    assert trailing["x-capstan-queue-ids"] == "2,2,2"
    assert shared_broker.queue_ends("Named") == [0, 0, 3, 0]


def test_a_named_queue_wins_over_the_message_group_hash(shared_broker):
    shared_broker.create_topic("NamedFifo", kind="FIFO", queues=4)
    group = next(g for g in (f"g{i}" for i in range(100)) if zlib.crc32(g.encode()) % 4 != 3)
    m = v2_message("NamedFifo", message_group=group, message_type=pb.FIFO)
    reply, trailing = send_to_queue(stub(shared_broker.address), "3", m)
    assert reply.status.code == pb.OK, reply.status
    assert trailing["x-capstan-queue-ids"] == "3"
    assert shared_broker.queue_ends("NamedFifo") == [0, 0, 0, 1]


def test_without_the_header_the_answer_still_names_each_queue(shared_broker):
    shared_broker.create_topic("Unnamed", queues=4)
    stored: Counter[int] = Counter()
    for r in range(4):
        messages = [v2_message("Unnamed", f"m{r}-{i}".encode()) for i in range(3)]
        reply, trailing = send_to_queue(stub(shared_broker.address), None, *messages)
        assert reply.status.code == pb.OK, reply.status
        queue_ids = [int(q) for q in trailing["x-capstan-queue-ids"].split(",")]
        assert len(queue_ids) == 3 and len(set(queue_ids)) == 1  # one queue per request
        stored.update(queue_ids)
    assert set(stored) == {0, 1, 2, 3}  # the next request the next queue, round robin
    assert shared_broker.queue_ends("Unnamed") == [stored[q] for q in range(4)]


def test_without_the_header_a_message_group_keeps_its_hashed_queue(shared_broker):
    shared_broker.create_topic("UnnamedFifo", kind="FIFO", queues=4)
    m = v2_message("UnnamedFifo", message_group="g", message_type=pb.FIFO)
    reply, trailing = send_to_queue(stub(shared_broker.address), None, m)
    assert reply.status.code == pb.OK, reply.status
    assert trailing["x-capstan-queue-ids"] == str(zlib.crc32(b"g") % 4)
