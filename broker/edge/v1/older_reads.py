"""A static topic's older items read through the group that leads the logic queue:
the pulls and offsets of Capstan's SDK (capstan.v1 Pull and Consumer).

A consumer may pull a logic queue at its leading group from any logic offset. A pull at an
offset that an older item on another group holds is passed to that group's master, with the
client's metadata, and its answer goes back as it is; once the pull reached that item's
end, it reads on here. A committed offset inside an older item is committed on that item's
group; when this group holds no committed offset of the queue for a consumer group, the
one the older items' groups hold is asked for, newest item first. So a consumer that
follows a queue to its new group goes on where it stopped, and one that starts from the
first offset reads the whole queue.

A group that cannot be reached fails the call (the client tries again): the messages it
keeps are readable nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from capstan.broker.edge.forwarding import Forwarder
from capstan.broker.group_masters import OLDER_ITEMS_FOR, GroupMasters
from capstan.common.grpc_abort import abort
from capstan.v1 import consumer_pb2 as consumer_pb
from capstan.v1 import pull_pb2 as pull_pb


class OlderReads:
    def __init__(
        self, masters: GroupMasters, pulls: Forwarder, consumers: Forwarder, own_group: str
    ) -> None:
        """`pulls` and `consumers` call the Pull and Consumer services of other groups'
        masters."""
        self._masters = masters
        self._pulls = pulls
        self._consumers = consumers
        self._marks = [(OLDER_ITEMS_FOR, own_group)]

    async def pull(
        self, group: str, request: pull_pb.PullMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pull_pb.PullMessagesResponse:
        answer: pull_pb.PullMessagesResponse = await self._call(
            self._pulls, group, "PullMessages", request, context
        )
        return answer

    async def committed(
        self,
        groups: Sequence[str],
        request: consumer_pb.QueryOffsetRequest,
        context: grpc.aio.ServicerContext,
    ) -> int | None:
        """The committed offset the first of `groups` that holds one answers."""
        for group in groups:
            reply = await self._call(self._consumers, group, "QueryOffset", request, context)
            if reply.found:
                return int(reply.offset)
        return None

    async def commit(
        self,
        group: str,
        request: consumer_pb.CommitOffsetsRequest,
        context: grpc.aio.ServicerContext,
    ) -> None:
        await self._call(self._consumers, group, "CommitOffsets", request, context)

    async def _call(
        self,
        forwarder: Forwarder,
        group: str,
        name: str,
        request: Any,
        context: grpc.aio.ServicerContext,
    ) -> Any:
        address = await self._masters.address(group)
        if not address:
            await abort(
                context,
                grpc.StatusCode.UNAVAILABLE,
                f"group {group!r}, which keeps older messages of this logic queue, has no "
                "master this broker can find now; retry shortly",
            )
        try:
            return await forwarder.unary(address, name, request, context, marks=self._marks)
        except BaseException:
            self._masters.forget(group)
            raise
