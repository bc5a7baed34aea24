"""Building raw apache.rocketmq.v2 requests for tests that go below the official client."""

from __future__ import annotations

import time
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.common.message_id import new_message_id

METADATA = (("x-mq-client-id", "test-client"),)


def stub(address: str) -> svc_grpc.MessagingServiceStub:
    return svc_grpc.MessagingServiceStub(grpc.insecure_channel(address))


def ms(value: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(value)
    return d


def v2_message(topic: str, body: bytes = b"x", **system: Any) -> pb.Message:
    sp = pb.SystemProperties(
        message_id=new_message_id(), message_type=pb.NORMAL, body_encoding=pb.IDENTITY
    )
    for name, value in system.items():
        if name == "delivery_timestamp_ms":
            sp.delivery_timestamp.FromMilliseconds(value)
        elif name == "keys":
            sp.keys.extend(value)
        else:
            setattr(sp, name, value)
    return pb.Message(topic=pb.Resource(name=topic), system_properties=sp, body=body)


def send(
    s: svc_grpc.MessagingServiceStub, *messages: pb.Message, timeout_s: float = 10
) -> svc.SendMessageResponse:
    return s.SendMessage(
        svc.SendMessageRequest(messages=messages), metadata=METADATA, timeout=timeout_s
    )


def send_to_queue(
    s: svc_grpc.MessagingServiceStub, queue_id: str | None, *messages: pb.Message
) -> tuple[svc.SendMessageResponse, dict[str, str]]:
    """Send as Capstan's SDK does, naming the queue (unless None) in x-capstan-queue-id;
    the answer and its trailing metadata."""
    metadata = METADATA if queue_id is None else (*METADATA, ("x-capstan-queue-id", queue_id))
    reply, call = s.SendMessage.with_call(
        svc.SendMessageRequest(messages=messages), metadata=metadata, timeout=10
    )
    return reply, dict(call.trailing_metadata() or ())


def receive(
    s: svc_grpc.MessagingServiceStub,
    group: str,
    topic: str,
    batch: int = 32,
    invisible_ms: int | None = 5000,
    wait_ms: int = 1000,
    tag_expression: str = "*",
) -> tuple[pb.Status, list[pb.Message]]:
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression=tag_expression),
        batch_size=batch,
        long_polling_timeout=ms(wait_ms),
    )
    if invisible_ms is not None:
        request.invisible_duration.CopyFrom(ms(invisible_ms))
    status, messages = pb.Status(), []
    for response in s.ReceiveMessage(request, metadata=METADATA, timeout=wait_ms / 1000 + 5):
        kind = response.WhichOneof("content")
        if kind == "status":
            status = response.status
        elif kind == "message":
            messages.append(response.message)
    return status, messages


def ack(
    s: svc_grpc.MessagingServiceStub, group: str, topic: str, handle: str, message_id: str = ""
) -> svc.AckMessageResponse:
    entry = svc.AckMessageEntry(message_id=message_id, receipt_handle=handle)
    return s.AckMessage(
        svc.AckMessageRequest(
            group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=[entry]
        ),
        metadata=METADATA,
        timeout=10,
    )


def change_invisible(
    s: svc_grpc.MessagingServiceStub, group: str, topic: str, handle: str, invisible_ms: int
) -> svc.ChangeInvisibleDurationResponse:
    return s.ChangeInvisibleDuration(
        svc.ChangeInvisibleDurationRequest(
            group=pb.Resource(name=group),
            topic=pb.Resource(name=topic),
            receipt_handle=handle,
            invisible_duration=ms(invisible_ms),
        ),
        metadata=METADATA,
        timeout=10,
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000
