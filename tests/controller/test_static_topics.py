"""Static topics made through the controller: one call decides the mapping, records it and
hands it to every group of the topic, whose replicas keep it; bad requests are refused
before anything is recorded."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from capstan.client.queue_mapping_wire import mapping_from_wire
from capstan.common.queue_mapping import new_mapping
from capstan.v1 import admin_pb2 as pb
from tests.controller.test_admin_front import TwoGroups, refusal, start_two_groups, topic

Code = grpc.StatusCode


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoGroups]:
    c = start_two_groups(tmp_path_factory.mktemp("static"), {"group-a": 2, "group-b": 1})
    try:
        yield c
    finally:
        c.stop()


def static(name: str, queues: int = 4, groups: tuple[str, ...] = ()) -> pb.StaticTopicRequest:
    return pb.StaticTopicRequest(topic=topic(name, queues), groups=groups)


def held_by(broker, name: str) -> pb.QueueMappingReply:  # type: ignore[no-untyped-def]
    return broker.admin(here=True).GetQueueMapping(pb.QueueMappingRequest(topic=name), timeout=5)


def test_a_static_topic_is_decided_once_and_held_by_every_replica_of_its_groups(cluster):
    admin = cluster.admin()
    made = admin.CreateStaticTopic(static("Ledger"), timeout=15)
    expected = new_mapping("Ledger", 4, ["group-a", "group-b"])
    assert mapping_from_wire(made.mapping) == expected
    assert sorted(made.topic.brokers) == ["group-a", "group-b"]
    for group, brokers in cluster.groups.items():
        for broker in brokers:  # group-a's slave too: answered once it held the copy
            reply = held_by(broker, "Ledger")
            assert mapping_from_wire(reply.mapping) == expected, (group, broker.address)
            assert reply.topic.topic.write_queue_nums == 4
    kept = admin.GetQueueMapping(pb.QueueMappingRequest(topic="Ledger"), timeout=5)
    assert mapping_from_wire(kept.mapping) == expected
    # Repeating the call hands the same mapping on again; another one is refused.
    again = admin.CreateStaticTopic(static("Ledger"), timeout=15)
    assert mapping_from_wire(again.mapping) == expected
    other = refusal(lambda: admin.CreateStaticTopic(static("Ledger", 8), timeout=15))
    assert other.code() is Code.ALREADY_EXISTS
    assert "static topic 'Ledger' exists (epoch 1, groups group-a, group-b)" in other.details()


def test_a_static_topic_on_named_groups_only_reaches_those(cluster):
    admin = cluster.admin()
    made = admin.CreateStaticTopic(static("OnB", 3, ("group-b",)), timeout=15)
    assert mapping_from_wire(made.mapping).groups() == ["group-b"]
    assert mapping_from_wire(held_by(cluster.master("group-b"), "OnB").mapping).total_queues == 3
    missing = refusal(lambda: held_by(cluster.master("group-a"), "OnB"))
    assert missing.code() is Code.NOT_FOUND
    assert "no static topic 'OnB' on group 'group-a'" in missing.details()


def test_bad_requests_are_refused_naming_the_problem_and_nothing_is_recorded(cluster):
    admin = cluster.admin()
    unknown = refusal(lambda: admin.CreateStaticTopic(static("X", 2, ("group-z",)), timeout=10))
    assert unknown.code() is Code.NOT_FOUND
    assert "broker group 'group-z' is not registered with this controller" in unknown.details()
    none = refusal(lambda: admin.CreateStaticTopic(static("X", 0), timeout=10))
    assert none.code() is Code.INVALID_ARGUMENT and "1..1024 logic queues" in none.details()
    admin.CreateTopic(topic("Plain"), timeout=10)
    plain = refusal(lambda: admin.CreateStaticTopic(static("Plain"), timeout=10))
    assert plain.code() is Code.FAILED_PRECONDITION
    assert "exists as a normal topic on group-a, group-b" in plain.details()
    bad_name = refusal(lambda: admin.CreateStaticTopic(static("no spaces"), timeout=10))
    assert bad_name.code() is Code.INVALID_ARGUMENT and "may contain only" in bad_name.details()
    for name in ("X", "Plain", "no spaces"):
        gone = refusal(
            lambda n=name: admin.GetQueueMapping(pb.QueueMappingRequest(topic=n), timeout=5)
        )
        assert gone.code() is Code.NOT_FOUND
