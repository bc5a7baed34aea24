"""The operator's topic sync against a real broker: create, a two-phase shrink that waits
for the removed queue to be consumed, and deletion."""

from __future__ import annotations

import asyncio

import pytest
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.client.errors import TransportError
from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.operator.topic_sync import TopicAction, TopicShape, TopicStep, next_topic_step
from capstan.v1 import admin_pb2 as admin
from tests.broker.broker_process import BrokerProcess
from tests.broker.v2_requests import send_to_queue, stub, v2_message

FOUR = TopicShape(4, 4, 6, "NORMAL")
TWO = TopicShape(2, 2, 6, "NORMAL")


async def sync_once(group: BrokerGroupAdmin, desired: TopicShape) -> TopicStep:
    """One reconcile round, as the Topic handler runs it."""
    found = await group.topic("T")
    actual, ends = found if found is not None else (None, {})
    step = next_topic_step(desired, actual, ends, await group.committed("T"))
    if step.action in (TopicAction.CREATE, TopicAction.UPDATE):
        assert step.shape is not None
        await group.put_topic("T", step.shape, create=step.action is TopicAction.CREATE)
    return step


def test_create_shrink_in_two_phases_and_delete(broker: BrokerProcess) -> None:
    broker.create_group("G")

    async def scenario() -> list[str]:
        group = BrokerGroupAdmin(broker.address)
        seen = []
        try:
            assert (await sync_once(group, FOUR)).action is TopicAction.CREATE
            assert (await sync_once(group, FOUR)).action is TopicAction.IN_SYNC
            reply, _ = send_to_queue(stub(broker.address), "3", v2_message("T"), v2_message("T"))
            assert reply.status.code == pb.OK
            broker.admin().ResetOffset(
                admin.ResetOffsetRequest(group="G", topic="T", earliest=True)
            )
            for _ in range(3):
                step = await sync_once(group, TWO)
                seen.append(f"{step.action.value}:{step.phase}")
            shape, _ = await group.topic("T") or (None, {})
            assert shape is not None and (shape.read_queues, shape.write_queues) == (4, 2)
            broker.admin().ResetOffset(admin.ResetOffsetRequest(group="G", topic="T", latest=True))
            step = await sync_once(group, TWO)
            seen.append(f"{step.action.value}:{step.phase}")
            shape, _ = await group.topic("T") or (None, {})
            assert shape is not None and (shape.read_queues, shape.write_queues) == (2, 2)
            assert await group.delete_topic("T") is True
            assert await group.topic("T") is None
            assert await group.delete_topic("T") is False
        finally:
            await group.close()
        return seen

    assert asyncio.run(scenario()) == [
        "update:write-queues",
        "wait:read-queues",
        "wait:read-queues",
        "update:read-queues",
    ]


def test_an_unreachable_group_is_a_temporary_error() -> None:
    async def scenario() -> None:
        group = BrokerGroupAdmin("127.0.0.1:1")
        try:
            with pytest.raises(TransportError, match="UNAVAILABLE"):
                await group.topic("T")
        finally:
            await group.close()

    asyncio.run(scenario())
