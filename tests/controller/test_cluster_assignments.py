"""QueryAssignment under a controller names every broker group that holds the topic, on
whichever replica of whichever group it is asked: the official PushConsumer asks a random
queue of its route every 5 s and consumes exactly what the answer names."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from rocketmq import (
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    MessageListener,
    Producer,
    PushConsumer,
)
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.v1 import admin_pb2 as pb
from tests.broker.test_official_client import message
from tests.broker.v2_requests import METADATA
from tests.broker.v2_requests import stub as v2_stub
from tests.controller.test_admin_front import TwoGroups, start_two_groups, topic
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoGroups]:
    # group-a has a slave: every replica answers for the whole cluster.
    c = start_two_groups(tmp_path_factory.mktemp("assignments"), {"group-a": 2, "group-b": 1})
    try:
        admin = c.admin()
        admin.CreateTopic(topic("Both"), timeout=10)
        admin.CreateGroup(pb.Group(name="Concurrent"), timeout=10)
        admin.CreateGroup(pb.Group(name="Ordered", fifo=True), timeout=10)
        yield c
    finally:
        c.stop()


def assigned(address: str, group: str, name: str = "Both") -> list[tuple[str, int]]:
    request = svc.QueryAssignmentRequest(
        topic=v2.Resource(name=name), group=v2.Resource(name=group)
    )
    reply = v2_stub(address).QueryAssignment(request, metadata=METADATA, timeout=10)
    assert reply.status.code == v2.OK, reply.status
    return sorted((a.message_queue.broker.name, a.message_queue.id) for a in reply.assignments)


def every_replica(cluster: TwoGroups) -> list[str]:
    return [b.address for brokers in cluster.groups.values() for b in brokers]


def test_every_replica_assigns_every_group_that_holds_the_topic(cluster):
    for address in every_replica(cluster):
        assert assigned(address, "Concurrent") == [("group-a", -1), ("group-b", -1)]
        assert assigned(address, "Ordered") == [
            (g, q) for g in ("group-a", "group-b") for q in range(4)
        ]


def test_the_official_push_consumer_consumes_both_groups_without_pausing_either(cluster):
    config = ClientConfiguration(cluster.controller.address, Credentials(), request_timeout=3)
    consumed: dict[bytes, float] = {}
    lock = threading.Lock()

    class Listener(MessageListener):  # type: ignore[misc]
        def consume(self, m):  # type: ignore[no-untyped-def]
            with lock:
                consumed.setdefault(m.body, time.monotonic())
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(config, "Concurrent", Listener(), {"Both": FilterExpression("*")})
    producer = Producer(config, ("Both",))
    consumer.startup()
    producer.startup()
    acked: dict[bytes, float] = {}
    try:
        # The consumer scans its assignments every 5 s: 16 s of sends span three scans,
        # each asking one group picked at random.
        began = time.monotonic()
        n = 0
        while time.monotonic() - began < 16:
            body = f"both-{n}".encode()
            producer.send(message("Both", body))
            acked[body] = time.monotonic()
            n += 1
            time.sleep(0.1)
        wait_until(lambda: len(consumed) >= len(acked), 30, "every message consumed")
    finally:
        producer.shutdown()
        consumer.shutdown()
    stored = {g: sum(cluster.master(g).queue_ends("Both", here=True)) for g in cluster.groups}
    assert all(count > 0 for count in stored.values()), stored
    waits = sorted(((consumed[b] - t), b) for b, t in acked.items())
    assert waits[-1][0] < 3.0, f"the longest waits (s, body): {waits[-5:]}"


def test_a_controller_that_stops_answering_leaves_the_last_joined_assignments(cluster):
    address = cluster.master("group-b").address
    assert assigned(address, "Concurrent") == [("group-a", -1), ("group-b", -1)]
    cluster.controller.stop()
    try:
        assert assigned(address, "Concurrent") == [("group-a", -1), ("group-b", -1)]
    finally:
        cluster.controller.start()
    wait_until(cluster.settled, 30, "the cluster settled again")
