"""The operator's static Topic: its decisions, and its rounds against a real controller and
two broker groups - spread over a new group, drained of the old one, which is then deleted
and retired - with every message sent read back once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from rocketmq import ClientConfiguration, Credentials, Producer
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.common.queue_mapping import QueueMapping, begin_move, new_mapping, remap
from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.operator.controller_admin import ControllerAdmin
from capstan.operator.static_topic_sync import (
    StaticAction,
    StaticStep,
    mapping_status,
    next_static_step,
    repair_static_settings,
    sync_static_round,
)
from capstan.operator.topic_sync import TopicShape
from capstan.v1 import admin_pb2 as pb
from tests.broker.test_official_client import message
from tests.broker.v2_requests import stub as v2_stub
from tests.controller.test_admin_front import TwoGroups, read_back, start_two_groups


def test_a_static_topic_is_made_then_spread_one_queue_at_a_time():
    assert next_static_step(None, ["a"], 4).action is StaticAction.CREATE
    m = new_mapping("T", 4, ["a"])
    assert next_static_step(m, ["a"], 4) == StaticStep(StaticAction.IN_SYNC, "4 logic queues on a")
    step = next_static_step(m, ["a", "b"], 4)
    assert (step.action, step.queue, step.group, step.remaining) == (StaticAction.MOVE, 2, "b", 1)
    assert step.reason == "moving logic queue 2 from group 'a' to group 'b' (1 more after it)"
    refused = next_static_step(m, ["a"], 8)
    assert refused.action is StaticAction.REFUSE
    assert "has 4 logic queues; a static topic's logic queue count cannot change" in refused.reason
    assert next_static_step(m, [], 4).action is StaticAction.REFUSE


def test_a_move_between_its_steps_is_waited_for_and_the_status_shows_the_mapping():
    moving = begin_move(new_mapping("T", 2, ["a"]), 1, "b")
    step = next_static_step(moving, ["a", "b"], 2)
    assert (
        step.action is StaticAction.WAIT and "logic queue 1 is moving to group 'b'" in step.reason
    )
    moved = remap(new_mapping("T", 2, ["a"]), 1, "b", old_end=3, new_start=0)
    assert mapping_status(moved, 0) == {
        "epoch": 2,
        "movesRemaining": 0,
        "queues": [
            {"queue": 0, "group": "a", "items": 1, "moving": False},
            {"queue": 1, "group": "b", "items": 2, "moving": False},
        ],
    }


@pytest.fixture
def cluster(tmp_path) -> Iterator[TwoGroups]:  # type: ignore[no-untyped-def]
    c = start_two_groups(tmp_path, {"group-a": 1, "group-b": 1})
    try:
        yield c
    finally:
        c.stop()


SHAPE = TopicShape(4, 4, 6, "NORMAL")


def test_spreading_then_draining_a_group_then_retiring_it_loses_nothing(cluster):
    config = ClientConfiguration(cluster.controller.address, Credentials(), request_timeout=5)
    told: list[tuple[str, str]] = []

    async def done(reason: str, text: str, mapping: QueueMapping, step: StaticStep) -> None:
        told.append((reason, text))

    async def round_(groups: list[str]) -> tuple[QueueMapping | None, StaticStep]:
        admin = ControllerAdmin([cluster.controller.address])
        try:
            return await sync_static_round(admin, "Spread", 4, SHAPE, groups, done, 30)
        finally:
            await admin.close()

    sent: list[bytes] = []

    def produce(tag: str) -> None:
        producer = Producer(config, ("Spread",))
        producer.startup()
        try:
            for n in range(20):
                body = f"{tag}-{n}".encode()
                producer.send(message("Spread", body))
                sent.append(body)
        finally:
            producer.shutdown()

    mapping, step = asyncio.run(round_(["group-a"]))
    assert step.action is StaticAction.IN_SYNC and mapping is not None
    assert told == [("StaticTopicCreated", "creating 4 logic queues on group-a")]
    produce("one-group")
    mapping, step = asyncio.run(round_(["group-a", "group-b"]))
    assert step.action is StaticAction.IN_SYNC and mapping is not None
    assert [len(mapping.led_by(g)) for g in ("group-a", "group-b")] == [2, 2]
    assert [r for r, _ in told[1:]] == ["LogicQueueMoved", "LogicQueueMoved"]
    produce("two-groups")
    mapping, step = asyncio.run(round_(["group-b"]))  # group-a is drained of writes
    assert step.action is StaticAction.IN_SYNC and mapping is not None
    assert mapping.led_by("group-a") == [] and len(mapping.led_by("group-b")) == 4
    produce("drained")
    cluster.admin().CreateGroup(pb.Group(name="SpreadReaders"), timeout=10)
    got = read_back(config, "SpreadReaders", "Spread", len(sent), timeout_s=60)
    assert sorted(got) == sorted(sent)  # nothing lost, nothing twice, from both groups
    # group-a goes (its BrokerGroup deleted): the operator retires it from the mapping.
    for broker in cluster.groups.pop("group-a"):
        broker.stop()

    async def retire() -> QueueMapping:
        admin = ControllerAdmin([cluster.controller.address])
        try:
            return await admin.retire("Spread", "group-a")
        finally:
            await admin.close()

    retired = asyncio.run(retire())
    assert retired.groups() == ["group-b"]
    routes = v2_stub(cluster.controller.address).QueryRoute(
        svc.QueryRouteRequest(topic=v2.Resource(name="Spread")), timeout=10
    )
    assert {(q.broker.name, q.permission) for q in routes.message_queues} == {
        ("group-b", v2.READ_WRITE)
    }
    sent.clear()
    produce("retired")
    got = read_back(config, "SpreadReaders", "Spread", len(sent), timeout_s=30)
    assert sorted(got) == sorted(sent)


def test_settings_changed_on_a_group_by_hand_are_put_back_and_named(cluster):
    async def made() -> None:
        admin = ControllerAdmin([cluster.controller.address])
        try:
            await admin.create_static("Tuned", 4, SHAPE, ["group-a", "group-b"])
        finally:
            await admin.close()

    asyncio.run(made())
    on_b = cluster.master("group-b").admin(here=True)
    on_b.UpdateTopic(pb.Topic(name="Tuned", perm=4, type=pb.FIFO), timeout=10)

    async def repair() -> dict[str, tuple[str, ...]]:
        admins = {g: BrokerGroupAdmin(cluster.master(g).address) for g in cluster.groups}
        try:
            return await repair_static_settings(admins, "Tuned", SHAPE)
        finally:
            for admin in admins.values():
                await admin.close()

    assert asyncio.run(repair()) == {"group-b": ("perm", "message_type")}
    back = on_b.DescribeTopic(pb.TopicRequest(name="Tuned"), timeout=10).topic.topic
    assert (back.perm, back.type, back.write_queue_nums) == (6, pb.NORMAL, 4)
    assert asyncio.run(repair()) == {}
