"""broker/edge/v2/older_items.py against a group slow to answer: a real gRPC server that
hands its message out and answers only after the leading group stopped waiting (a loaded
machine), as a broker does once it has popped the message. The answer is kept for the
consumer group's next receive, not dropped while the message stays invisible there."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.broker.edge.v2.older_items import LOOK_TIMEOUT_S, PAUSE_S, OlderItems, unwrap
from capstan.broker.group_masters import GroupMasters
from tests.broker.v2_requests import ms

ANSWER_AFTER_S = LOOK_TIMEOUT_S + 0.5

pytestmark = pytest.mark.asyncio


class SlowGroup(svc_grpc.MessagingServiceServicer):
    """Hands out its one message at the first receive, answering ANSWER_AFTER_S later;
    nothing after that (the message is invisible here)."""

    def __init__(self) -> None:
        self.asked = 0

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.asked += 1
        if self.asked > 1:
            yield svc.ReceiveMessageResponse(status=pb.Status(code=pb.MESSAGE_NOT_FOUND))
            return
        await asyncio.sleep(ANSWER_AFTER_S)
        yield svc.ReceiveMessageResponse(status=pb.Status(code=pb.OK))
        message = pb.Message(topic=pb.Resource(name="T"), body=b"old0")
        message.system_properties.receipt_handle = "h0"
        yield svc.ReceiveMessageResponse(message=message)


class ClientCall:
    """What OlderItems reads of the client's call it serves."""

    def time_remaining(self) -> float:
        return 20.0

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-mq-client-id", "c"),)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def _request(invisible_ms: int) -> svc.ReceiveMessageRequest:
    return svc.ReceiveMessageRequest(
        group=pb.Resource(name="G"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="T"), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
        batch_size=8,
        invisible_duration=ms(invisible_ms),
    )


@pytest_asyncio.fixture
async def slow_group() -> AsyncIterator[tuple[SlowGroup, str]]:
    server = grpc.aio.server()
    group = SlowGroup()
    svc_grpc.add_MessagingServiceServicer_to_server(group, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield group, f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def _older(address: str) -> OlderItems:
    async def locate(group: str) -> str:
        return address if group == "slow" else ""

    return OlderItems(GroupMasters(locate), "leading")


async def test_a_late_answer_is_handed_to_the_next_receive(slow_group) -> None:
    group, address = slow_group
    older = await _older(address)
    try:
        first = await older.receive(["slow"], _request(20_000), ClientCall())
        assert first == []  # it did not answer within LOOK_TIMEOUT_S
        await asyncio.sleep(ANSWER_AFTER_S - LOOK_TIMEOUT_S + 0.2 + PAUSE_S)
        later = await older.receive(["slow"], _request(20_000), ClientCall())
        assert [a.message.body for a in later] == [b"old0"]
        assert unwrap(later[0].message.system_properties.receipt_handle) == ("slow", "h0")
        assert group.asked == 1  # not asked again while its answer was on the way
    finally:
        await older.close()


async def test_a_late_answer_too_near_its_invisible_time_is_not_handed_out(slow_group) -> None:
    """Kept past half its invisible time, the message would soon be due again at its group
    and could reach two consumers: it is left to come due there."""
    _, address = slow_group
    older = await _older(address)
    try:
        invisible_ms = int(ANSWER_AFTER_S * 1000)  # half of it has passed once it answers
        assert await older.receive(["slow"], _request(invisible_ms), ClientCall()) == []
        await asyncio.sleep(ANSWER_AFTER_S - LOOK_TIMEOUT_S + 0.2 + PAUSE_S)
        assert await older.receive(["slow"], _request(invisible_ms), ClientCall()) == []
    finally:
        await older.close()


class EndedCall(ClientCall):
    """A client's call that ends while OlderItems still works for it: reading it then is
    reading freed memory in grpc (a broker died of SIGSEGV in peer() that way)."""

    def __init__(self) -> None:
        self.ended = False

    def _alive(self) -> None:
        if self.ended:
            raise AssertionError("the client's call was read after it ended")

    def time_remaining(self) -> float:
        self._alive()
        return 20.0

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        self._alive()
        return super().invocation_metadata()

    def peer(self) -> str:
        self._alive()
        return super().peer()


async def test_a_look_that_outlives_its_clients_call_never_reads_that_call(slow_group) -> None:
    """The group's master is found only after the client's call has ended (cancelled, as
    when the client goes): the call to the group goes on, with what the client's call said
    when the look began, and its answer is kept for the next receive."""
    group, address = slow_group
    found = asyncio.Event()

    async def locate_late(name: str) -> str:
        await found.wait()
        return address if name == "slow" else ""

    older = OlderItems(GroupMasters(locate_late), "leading")
    client = EndedCall()
    try:
        receiving = asyncio.create_task(older.receive(["slow"], _request(20_000), client))
        await asyncio.sleep(0.2)
        receiving.cancel()  # the client went
        with pytest.raises(asyncio.CancelledError):
            await receiving
        client.ended = True
        found.set()
        await asyncio.sleep(ANSWER_AFTER_S + 0.3 + PAUSE_S)
        later = await older.receive(["slow"], _request(20_000), ClientCall())
        assert [a.message.body for a in later] == [b"old0"]
        assert group.asked == 1
    finally:
        await older.close()
