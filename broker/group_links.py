"""Calls this broker makes, as the cluster, to the masters of other broker groups: what
static topics need from the groups that hold a logic queue's other items.

A group's master is found through the controller (group_masters.py); a failed call
forgets it, so the next one asks again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import grpc

from capstan.broker.group_masters import OLDER_ITEMS_FOR, GroupMasters
from capstan.broker.handed_messages import to_handed
from capstan.broker.store.message import Message
from capstan.common.channel_pool import ChannelPool
from capstan.security.peers import dial_peer
from capstan.v1 import admin_pb2 as admin_pb
from capstan.v1 import admin_pb2_grpc as admin_grpc
from capstan.v1 import consumer_pb2 as consumer_pb
from capstan.v1 import consumer_pb2_grpc as consumer_grpc

CALL_TIMEOUT_S = 5.0


class NoMaster(Exception):
    """The group has no master the controller knows of now."""


class GroupLinks:
    def __init__(self, locate: Callable[[str], Awaitable[str]], group: str) -> None:
        """`locate` names a group's master address ("" for none); `group` is this
        broker's own group, named in what it hands on."""
        self.masters = GroupMasters(locate)
        """Where each group's master is (the v2 edge's calls to other groups use it too)."""
        self._group = group
        self._channels = ChannelPool(dial_peer)

    async def close(self) -> None:
        await self._channels.close()

    async def _master(self, group: str) -> grpc.aio.Channel:
        address = await self.masters.address(group)
        if not address:
            raise NoMaster(f"group {group!r} has no master now")
        return self._channels.get(address)

    async def consumed_to(
        self, group: str, consumer_group: str, topic: str, queue: int
    ) -> tuple[int | None, int]:
        """On `group`: `consumer_group`'s committed offset of `topic`'s queue `queue`
        (None when it has none) and the queue's first offset, both as clients see them."""
        try:
            stub = consumer_grpc.ConsumerStub(await self._master(group))  # type: ignore[no-untyped-call]
            committed = await stub.QueryOffset(  # its own commit, never one it asks for
                consumer_pb.QueryOffsetRequest(group=consumer_group, topic=topic, queue_id=queue),
                timeout=CALL_TIMEOUT_S,
                metadata=[(OLDER_ITEMS_FOR, self._group)],
            )
            bounds = await stub.GetQueueBounds(  # what it holds itself
                consumer_pb.GetQueueBoundsRequest(topic=topic, queue_id=queue),
                timeout=CALL_TIMEOUT_S,
                metadata=[(OLDER_ITEMS_FOR, self._group)],
            )
        except grpc.aio.AioRpcError:
            self.masters.forget(group)
            raise
        return (committed.offset if committed.found else None), int(bounds.min_offset)

    async def place(self, group: str, messages: Sequence[Message]) -> admin_pb.PlaceMessagesReply:
        """Have `group` store `messages` in logic queues it leads (Admin.PlaceMessages)."""
        request = admin_pb.PlaceMessagesRequest(
            messages=[to_handed(m) for m in messages], from_group=self._group
        )
        try:
            stub = admin_grpc.AdminStub(await self._master(group))  # type: ignore[no-untyped-call]
            reply: admin_pb.PlaceMessagesReply = await stub.PlaceMessages(
                request, timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError:
            self.masters.forget(group)
            raise
        return reply
