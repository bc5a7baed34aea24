"""A consumer that receives and acknowledges messages itself (RocketMQ 5's SimpleConsumer).

`receive` asks the broker groups of the topic's route in turn (v2 ReceiveMessage, long
polling for up to `wait_s`). A received message is invisible to the group's other consumers
for `invisible_s`; `ack` it within that time, or it comes again, its delivery attempt
counted, until the group's retries are spent and it goes to the dead-letter queue.
`change_invisible_duration` asks for more time. Nothing here keeps offsets: the broker
tracks what was received and acknowledged (pop consumption), so any number of simple
consumers of a group share a topic's queues.

Calls go to the replica of a group that served last and move on to the next one that can
serve (`replica_choice.py`); with `retry_window_s`, a call that found no replica serving
(a master killed, until the next is elected) is tried again for that long.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self, TypeVar

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.client import wire
from capstan.client.channels import ChannelPool, call_metadata, new_client_id
from capstan.client.errors import ClientError, TransportError, from_exception, from_status
from capstan.client.message import MessageView
from capstan.client.replica_choice import ReplicaChoice
from capstan.client.route import RouteCache, RouteQueue
from capstan.security.signature import Credentials

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0
"""Deadline of an ack or invisibility change, and what a receive gets beyond its wait."""

RETRY_PAUSE_S = 0.3
"""Pause before a call goes round a group's replicas again, in seconds."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PoppedMessage:
    """A received message and what acknowledging it needs."""

    message: MessageView
    broker_name: str
    """The broker group that delivered it."""
    queue_id: int
    queue_offset: int
    delivery_attempt: int
    """1 the first time it is delivered, one more each time it comes again."""
    receipt_handle: str
    """What `ack` and `change_invisible_duration` name this delivery by."""


class SimpleConsumer:
    """Receives the messages of `topic` matching `tag_expression` ("*", or "a||b") for the
    consumer group `group`; thread-safe. `start()` it (or use it as a context manager).

    `endpoints`: "host:port" (or several, separated by ';'), the controller or brokers.
    `retry_window_s`: how long a call keeps retrying while no replica of a group serves.
    """

    def __init__(
        self,
        endpoints: list[str] | str,
        group: str,
        topic: str,
        *,
        tag_expression: str = "*",
        retry_window_s: float = 0.0,
        route_refresh_s: float = 30.0,
        client_id: str | None = None,
        credentials: Credentials | None = None,
        ca_file: str | None = None,
    ) -> None:
        if not group.strip() or not topic.strip():
            raise ValueError("a simple consumer needs a group and a topic")
        if retry_window_s < 0:
            raise ValueError("retry_window_s must not be negative")
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.replace(",", ";").split(";") if e.strip()]
        self.endpoints = [e.strip() for e in endpoints]
        self.group = group
        self.topic = topic
        self.tag_expression = tag_expression
        self.retry_window_s = retry_window_s
        self.client_id = client_id or new_client_id()
        self._channels = ChannelPool(credentials, ca_file)
        self._routes = RouteCache(self.endpoints, self._channels, self.client_id, route_refresh_s)
        self._metadata = call_metadata(self.client_id)
        self._replicas = ReplicaChoice()
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._started = False

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        with self._lock:
            if not self._started:
                self._routes.start()
                self._started = True
        return self

    def shutdown(self) -> None:
        self._routes.stop()
        self._channels.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # -- the topic ---------------------------------------------------------------------

    def broker_groups(self) -> list[str]:
        """The broker groups holding a readable queue of the topic (asking for its route
        when it is not known yet). Raises ClientError."""
        return sorted({q.broker_name for q in self._routes.read_queues(self.topic)})

    def _group_queue(self, broker_name: str | None) -> RouteQueue:
        """A readable queue of the group (of the next group in turn, for None)."""
        queues = self._routes.read_queues(self.topic)
        firsts = {q.broker_name: q for q in reversed(queues)}
        if not firsts:
            raise ClientError(f"topic {self.topic} has no readable queue now", "FORBIDDEN")
        if broker_name is None:
            names = sorted(firsts)
            return firsts[names[next(self._turn) % len(names)]]
        if broker_name in firsts:
            return firsts[broker_name]
        left = self._routes.group_entry(self.topic, broker_name)  # a message taken there
        if left is None:
            raise ClientError(f"broker group {broker_name} serves no queue of {self.topic} now")
        return left

    # -- calls ---------------------------------------------------------------------------

    def receive(
        self, max_messages: int = 16, invisible_s: float = 30.0, wait_s: float = 20.0
    ) -> list[PoppedMessage]:
        """Up to `max_messages` (1..32) messages from the next broker group in turn, waiting
        up to `wait_s` for the first; an empty list when none came. Raises ClientError."""
        if not 1 <= max_messages <= 32:
            raise ValueError("max_messages must be in 1..32")
        if invisible_s <= 0 or wait_s < 0:
            raise ValueError("invisible_s must be positive and wait_s not negative")
        queue = self._group_queue(None)
        request = svc.ReceiveMessageRequest(
            group=pb.Resource(name=self.group),
            message_queue=pb.MessageQueue(topic=pb.Resource(name=self.topic), id=-1),
            filter_expression=pb.FilterExpression(type=pb.TAG, expression=self.tag_expression),
            batch_size=max_messages,
            invisible_duration=wire.duration(invisible_s),
            long_polling_timeout=wire.duration(wait_s),
            auto_renew=False,
        )

        def call(stub: svc_grpc.MessagingServiceStub, address: str) -> list[PoppedMessage]:
            found = []
            replies = stub.ReceiveMessage(
                request, metadata=self._metadata, timeout=wait_s + CALL_TIMEOUT_S
            )
            for reply in replies:
                kind = reply.WhichOneof("content")
                if kind == "status" and reply.status.code not in (pb.OK, pb.MESSAGE_NOT_FOUND):
                    raise from_status(reply.status, f"ReceiveMessage at {address}")
                if kind == "message":
                    found.append(_popped(reply.message, queue))
            return found

        return self._call(queue, "ReceiveMessage", call)

    def ack(self, message: PoppedMessage) -> None:
        """Acknowledge `message`: it is consumed and never comes again. Raises ClientError
        (an ack after the message became visible again is refused)."""
        request = svc.AckMessageRequest(
            group=pb.Resource(name=self.group),
            topic=pb.Resource(name=self.topic),
            entries=[
                svc.AckMessageEntry(
                    message_id=message.message.message_id,
                    receipt_handle=message.receipt_handle,
                )
            ],
        )

        def call(stub: svc_grpc.MessagingServiceStub, address: str) -> None:
            reply = stub.AckMessage(request, metadata=self._metadata, timeout=CALL_TIMEOUT_S)
            statuses = [reply.status, *(e.status for e in reply.entries)]
            for status in statuses:
                if status.code not in (pb.OK, pb.MULTIPLE_RESULTS):
                    raise from_status(status, f"AckMessage at {address}")

        self._call(self._group_queue(message.broker_name), "AckMessage", call)

    def change_invisible_duration(self, message: PoppedMessage, invisible_s: float) -> str:
        """Keep `message` invisible for `invisible_s` from now; the new receipt handle (the
        old one no longer acknowledges it). Raises ClientError."""
        request = svc.ChangeInvisibleDurationRequest(
            group=pb.Resource(name=self.group),
            topic=pb.Resource(name=self.topic),
            receipt_handle=message.receipt_handle,
            invisible_duration=wire.duration(invisible_s),
            message_id=message.message.message_id,
        )

        def call(stub: svc_grpc.MessagingServiceStub, address: str) -> str:
            reply = stub.ChangeInvisibleDuration(
                request, metadata=self._metadata, timeout=CALL_TIMEOUT_S
            )
            if reply.status.code != pb.OK:
                raise from_status(reply.status, f"ChangeInvisibleDuration at {address}")
            return str(reply.receipt_handle)

        return self._call(self._group_queue(message.broker_name), "ChangeInvisibleDuration", call)

    def _call(
        self,
        queue: RouteQueue,
        what: str,
        run: Callable[[svc_grpc.MessagingServiceStub, str], T],
    ) -> T:
        """`run` on the group's replica in use, moving on to the next one that cannot be
        reached or answers UNAVAILABLE, round after round within the retry window."""
        deadline = time.monotonic() + self.retry_window_s
        while True:
            failure: ClientError | None = None
            for _ in queue.addresses:
                address = self._replicas.address(queue)
                stub = svc_grpc.MessagingServiceStub(self._channels.get(address))
                try:
                    return run(stub, address)
                except (grpc.RpcError, ValueError, RuntimeError) as exc:
                    failure = from_exception(exc, f"{what} to {queue.broker_name} at {address}")
                if not isinstance(failure, TransportError):
                    raise failure
                self._replicas.failed(queue, address)
            assert failure is not None
            if time.monotonic() >= deadline:
                raise failure
            log.info("no replica of %s serves now, retrying: %s", queue.broker_name, failure)
            time.sleep(RETRY_PAUSE_S)
            self._routes.invalidate(self.topic)
            queue = self._group_queue(queue.broker_name)


def _popped(m: pb.Message, queue: RouteQueue) -> PoppedMessage:
    sp = m.system_properties
    return PoppedMessage(
        message=wire.to_view(m),
        broker_name=queue.broker_name,
        queue_id=int(sp.queue_id),
        queue_offset=int(sp.queue_offset),
        delivery_attempt=int(sp.delivery_attempt),
        receipt_handle=str(sp.receipt_handle),
    )
