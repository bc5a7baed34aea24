"""The operator's calls to one broker group, through capstan.v1 Admin on its client Service.

Reads give the pure decision modules their inputs (topic_sync.py, scaling.py); writes
carry out their steps. A broker that cannot be reached raises `Unreachable`, which the
handlers turn into a temporary error with backoff, shown in the status.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

from capstan.common.channel_pool import CHANNEL_OPTIONS
from capstan.operator.scaling import Backlog
from capstan.operator.topic_sync import TopicShape
from capstan.v1 import admin_pb2 as pb
from capstan.v1 import admin_pb2_grpc as pb_grpc

CALL_TIMEOUT_S = 10.0

_TEMPORARY = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.FAILED_PRECONDITION,
}


class Unreachable(Exception):
    """The broker group did not answer; try again later."""


class Refused(Exception):
    """The broker group refused the change; the message says why."""


def _raised(exc: grpc.aio.AioRpcError, what: str) -> Exception:
    detail = f"{what}: {exc.code().name}: {exc.details()}"
    return Unreachable(detail) if exc.code() in _TEMPORARY else Refused(detail)


class BrokerGroupAdmin:
    def __init__(self, target: str) -> None:
        """`target` is the group's client Service, host:port."""
        self.target = target
        self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.AdminStub(self._channel)  # type: ignore[no-untyped-call]

    async def close(self) -> None:
        await self._channel.close()

    async def topic(self, name: str) -> tuple[TopicShape, dict[int, int]] | None:
        """The topic's settings and each queue's end offset, None when the group lacks it."""
        try:
            reply = await self._stub.DescribeTopic(
                pb.TopicRequest(name=name), timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return None
            raise _raised(exc, f"describing topic {name}") from None
        t = reply.topic.topic
        shape = TopicShape(
            t.read_queue_nums,
            t.write_queue_nums,
            t.perm,
            pb.TopicType.Name(t.type),
            dict(t.attributes),
        )
        return shape, {q.queue_id: q.max_offset for q in reply.topic.queues}

    async def committed(self, topic: str) -> dict[str, dict[int, int]]:
        """Per consumer group that committed on `topic`: queue id -> committed offset."""
        try:
            reply = await self._stub.ListGroups(pb.ListGroupsRequest(), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise _raised(exc, "listing consumer groups") from None
        out: dict[str, dict[int, int]] = {}
        for group in reply.groups:
            for o in group.offsets:
                if o.topic == topic:
                    out.setdefault(group.group.name, {})[o.queue_id] = o.committed_offset
        return out

    async def put_topic(self, name: str, shape: TopicShape, create: bool) -> None:
        request = pb.Topic(
            name=name,
            type=shape.message_type,  # the enum by name
            read_queue_nums=shape.read_queues,
            write_queue_nums=shape.write_queues,
            perm=shape.perm,
            attributes=dict(shape.attributes),
        )
        call = self._stub.CreateTopic if create else self._stub.UpdateTopic
        try:
            await call(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            raise _raised(exc, f"{'creating' if create else 'updating'} topic {name}") from None

    async def delete_topic(self, name: str) -> bool:
        """Delete the topic; False when the group did not have it."""
        try:
            reply = await self._stub.DeleteTopic(pb.TopicRequest(name=name), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return False
            raise _raised(exc, f"deleting topic {name}") from None
        return bool(reply.deleted)

    async def backlog(self) -> Backlog:
        try:
            reply = await self._stub.DescribeBroker(
                pb.DescribeBrokerRequest(), timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            raise _raised(exc, "reading the broker's backlog") from None
        return Backlog(reply.unconsumed, reply.half_messages, reply.timers_waiting)

    async def put_group(
        self, name: str, fifo: bool, max_attempts: int, create: bool
    ) -> dict[str, int]:
        """Create or update the group; its lag per topic."""
        request = pb.Group(name=name, fifo=fifo, max_attempts=max_attempts, consume_enable=True)
        call = self._stub.CreateGroup if create else self._stub.UpdateGroup
        try:
            reply = await call(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if create and exc.code() is grpc.StatusCode.ALREADY_EXISTS:
                return await self.put_group(name, fifo, max_attempts, create=False)
            raise _raised(exc, f"{'creating' if create else 'updating'} group {name}") from None
        return lag_by_topic(reply.group.offsets)


def lag_by_topic(offsets: Iterable[pb.GroupQueueOffset]) -> dict[str, int]:
    """A group's lag, summed over each topic's queues (retry topics included)."""
    lag: dict[str, int] = {}
    for o in offsets:
        lag[o.topic] = lag.get(o.topic, 0) + max(0, o.lag)
    return lag
