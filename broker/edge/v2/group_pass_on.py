"""Sends a broker passes on to another broker group: a static topic's message whose logic
queue another group leads (broker/static_topics.py).

A message group (or a compact topic's key) maps to one logic queue over all of a static
topic's logic queues, whichever broker the client picked; when another group leads that
queue, the whole request goes to that group's master, found through the controller (and
kept for a couple of seconds), with the client's metadata, the forwarded mark (so the
master serves it itself) and `PASSED_FROM_GROUP`, so it is never passed on a second time
(a replica's pass to its own master first does not count). The answer, trailers included,
goes back to the client as the master gave it; one that says the broker is not the master
(HA_NOT_AVAILABLE: its master changed since the address was looked up) sends the request
once more, to the master the controller names now, if that is another broker.
"""

from __future__ import annotations

from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.broker.edge.forwarding import Forwarder
from capstan.broker.edge.v2.codes import RequestError
from capstan.broker.group_masters import GroupMasters

PASSED_FROM_GROUP = "x-capstan-passed-from-group"
"""Marks a send another group passed on: the group named there did not lead its queue."""


class PassOn(Exception):
    """Every message of the request belongs to a logic queue `group` leads."""

    def __init__(self, group: str) -> None:
        super().__init__(group)
        self.group = group


class GroupPassOn:
    def __init__(self, forwarder: Forwarder, masters: GroupMasters) -> None:
        self._forwarder = forwarder
        self._masters = masters

    async def send(self, group: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """The answer of `group`'s master to the SendMessage `request`."""
        if _passed_between_groups(context):
            raise RequestError(
                pb.FORBIDDEN,
                f"this send was passed on to group {group!r}'s master, which does not lead "
                "its logic queue either: the groups hold different mappings; retry shortly",
            )
        address = await self._masters.address(group)
        if not address:
            raise RequestError(
                pb.FORBIDDEN,
                f"the logic queue takes its writes on group {group!r}, which has no master "
                "this broker can find now; retry shortly",
            )
        answer = await self._pass(group, address, request, context)
        if answer.status.code != pb.HA_NOT_AVAILABLE:
            return answer
        # The broker named is no longer the master (it took no writes) or its copies fall
        # short: where the controller names another master now, the send goes there once.
        self._masters.forget(group)
        now = await self._masters.address(group)
        if not now or now == address:
            return answer
        return await self._pass(group, now, request, context)

    async def _pass(
        self, group: str, address: str, request: Any, context: grpc.aio.ServicerContext
    ) -> Any:
        try:
            return await self._forwarder.unary(
                address, "SendMessage", request, context, marks=[(PASSED_FROM_GROUP, "1")]
            )
        except BaseException:
            self._masters.forget(group)
            raise


def _passed_between_groups(context: grpc.aio.ServicerContext) -> bool:
    return any(key == PASSED_FROM_GROUP for key, _ in context.invocation_metadata() or ())
