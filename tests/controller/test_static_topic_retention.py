"""A static topic's oldest items leave its mapping once retention removed their messages on
their group: the controller notices it from the groups' queue bounds, records the shorter
mapping, and a group left with no item has the topic deleted."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.client.queue_mapping_wire import mapping_from_wire
from capstan.v1 import admin_pb2 as pb
from tests.broker.v2_requests import send_to_queue, v2_message
from tests.broker.v2_requests import stub as v2_stub
from tests.controller.test_admin_front import TwoGroups, start_two_groups, topic
from tests.waiting import wait_until

RETENTION = {
    "commitlog_segment_bytes": 64 * 1024,
    "file_reserved_hours": 0.0005,  # 1.8 s
    "clean_interval_ms": 300,
}


@pytest.fixture
def cluster(tmp_path) -> Iterator[TwoGroups]:  # type: ignore[no-untyped-def]
    c = start_two_groups(tmp_path, {"group-a": 1, "group-b": 1}, RETENTION)
    try:
        yield c
    finally:
        c.stop()


def test_items_retention_emptied_leave_the_mapping_and_the_group(cluster):
    admin = cluster.admin()
    admin.CreateStaticTopic(
        pb.StaticTopicRequest(topic=topic("Aging", 1), groups=["group-a"]), timeout=15
    )
    a, b = cluster.master("group-a"), cluster.master("group-b")
    for _ in range(100):
        reply, _ = send_to_queue(v2_stub(a.address), "0", v2_message("Aging", b"r" * 1000))
        assert reply.status.code == v2.OK
    admin.RemapStaticQueue(pb.RemapRequest(topic="Aging", queue_id=0, group="group-b"), timeout=15)
    reply, _ = send_to_queue(v2_stub(b.address), "0", v2_message("Aging", b"new"))
    assert reply.entries[0].offset == 100
    # group-a goes on storing other messages; the segments holding Aging's messages age and go.
    a.admin().CreateTopic(topic("Filler", 1), timeout=10)
    for _ in range(200):
        reply, _ = send_to_queue(v2_stub(a.address), "0", v2_message("Filler", b"f" * 1000))
        assert reply.status.code == v2.OK

    def items() -> list[tuple[str, int]]:
        reply = admin.GetQueueMapping(pb.QueueMappingRequest(topic="Aging"), timeout=5)
        return [(i.group, i.logic_offset) for i in mapping_from_wire(reply.mapping).items(0)]

    wait_until(lambda: items() == [("group-b", 100)], 60, "group-a's item dropped")

    def held_on_a() -> bool:
        """Whether group-a still has the topic: the keeper records the trimmed mapping
        first, then hands it on and deletes the topic where no item is left."""
        try:
            a.admin(here=True).DescribeTopic(pb.TopicRequest(name="Aging"), timeout=5)
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.NOT_FOUND, exc
            return False
        return True

    wait_until(lambda: not held_on_a(), 15, "the topic deleted from group-a")
    routes = v2_stub(cluster.controller.address).QueryRoute(
        svc.QueryRouteRequest(topic=v2.Resource(name="Aging")), timeout=10
    )
    assert {(q.broker.name, q.permission) for q in routes.message_queues} == {
        ("group-b", v2.READ_WRITE)
    }
    stale, _ = send_to_queue(v2_stub(a.address), "0", v2_message("Aging", b"late"))
    assert stale.status.code == v2.TOPIC_NOT_FOUND  # the client asks the route again
    reply, _ = send_to_queue(v2_stub(b.address), "0", v2_message("Aging", b"later"))
    assert reply.entries[0].offset == 101
