"""What the SDK's tests ask a broker directly, around the SDK under test."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.v1 import consumer_pb2 as c
from capstan.v1 import consumer_pb2_grpc as c_grpc
from tests.broker.broker_process import BrokerProcess
from tests.broker.v2_requests import send, stub, v2_message


def produce(broker: BrokerProcess, topic: str, bodies: Sequence[str], **system: object) -> None:
    """Send each body as one message, with the official protocol; each must be stored."""
    s = stub(broker.address)
    for body in bodies:
        reply = send(s, v2_message(topic, body.encode(), **system))
        assert reply.status.code == pb.OK, reply


def committed(broker: BrokerProcess, group: str, topic: str, queue_id: int) -> int:
    """The group's offset as the broker answers QueryOffset (-1: none)."""
    s = c_grpc.ConsumerStub(grpc.insecure_channel(broker.address))  # type: ignore[no-untyped-call]
    reply = s.QueryOffset(c.QueryOffsetRequest(group=group, topic=topic, queue_id=queue_id))
    return reply.offset if reply.found else -1
