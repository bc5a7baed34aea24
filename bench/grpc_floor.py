"""A protocol-only peer for `capstan bench broker`: a grpc.aio server speaking the v2
SendMessage, ReceiveMessage and AckMessage RPCs (and capstan.v1 PullMessages) that stores
nothing and answers with prebuilt messages.

It shows what gRPC, asyncio and protobuf alone cost for the benchmark's calls on the same
machine, with the same Python client: the most any grpc.aio broker could reach there.

Run as `python -m capstan.bench.grpc_floor`; it prints `gRPC endpoint: 127.0.0.1:PORT`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.v1 import pull_pb2, pull_pb2_grpc

_BODY = os.urandom(1024)
_OK = pb.Status(code=pb.OK, message="OK")
_RECEIVE_OK = svc.ReceiveMessageResponse(status=_OK)


def _delivered(n: int) -> pb.Message:
    return pb.Message(
        topic=pb.Resource(name="BenchBatch"),
        system_properties=pb.SystemProperties(
            message_id=f"{n:032X}",
            receipt_handle=f"{n:032X}" * 3,
            body_digest=pb.Digest(type=pb.CRC32, checksum="0BADF00D"),
            queue_offset=n,
            delivery_attempt=1,
        ),
        body=_BODY,
    )


class FloorMessaging(svc_grpc.MessagingServiceServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self._delivered = [svc.ReceiveMessageResponse(message=_delivered(n)) for n in range(1024)]

    async def SendMessage(self, request: svc.SendMessageRequest, context: Any) -> Any:
        response = svc.SendMessageResponse(status=_OK)
        add = response.entries.add
        for n, m in enumerate(request.messages):
            add(status=_OK, message_id=m.system_properties.message_id, offset=n)
        return response

    async def ReceiveMessage(
        self, request: svc.ReceiveMessageRequest, context: Any
    ) -> AsyncIterator[Any]:
        yield _RECEIVE_OK
        for response in self._delivered[: request.batch_size]:
            yield response

    async def AckMessage(self, request: svc.AckMessageRequest, context: Any) -> Any:
        response = svc.AckMessageResponse(status=_OK)
        add = response.entries.add
        for e in request.entries:
            add(message_id=e.message_id, receipt_handle=e.receipt_handle, status=_OK)
        return response


class FloorPull(pull_pb2_grpc.PullServicer):
    def __init__(self) -> None:
        self._messages = [
            pull_pb2.PulledMessage(queue_offset=n, message_id=f"{n:032X}", body=_BODY)
            for n in range(1024)
        ]

    async def PullMessages(self, request: pull_pb2.PullMessagesRequest, context: Any) -> Any:
        batch = self._messages[: request.max_messages]
        return pull_pb2.PullMessagesResponse(
            status=pull_pb2.FOUND,
            next_begin_offset=request.offset + len(batch),
            messages=batch,
        )


async def serve() -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    svc_grpc.add_MessagingServiceServicer_to_server(FloorMessaging(), server)
    pull_pb2_grpc.add_PullServicer_to_server(FloorPull(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"gRPC endpoint: 127.0.0.1:{port}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(grace=None)


if __name__ == "__main__":
    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(0)
