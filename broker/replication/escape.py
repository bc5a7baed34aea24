"""Storing what an acting master may not store itself on another group's master.

An acting master (acting_master.py) takes no writes, yet its timer delivers due delayed
messages, its transaction checks commit, and pop revive moves messages to dead-letter
topics. Those go to a master of another group (RocketMQ's escape bridge): the brokers in
`replication.escape_addresses`, tried in turn from the one that took the last batch. The
receiver (capstan.v1.ReplicaPeers/Escape) stores them in its own queues of the same topic
(a static topic's in a logic queue it leads; one that leads none refuses them, and the next
broker is tried).
"""

from __future__ import annotations

import logging

import grpc

from capstan.broker.handed_messages import to_handed
from capstan.broker.store.message import Message
from capstan.broker.store.status import PutResult, PutStatus
from capstan.common.channel_pool import ChannelPool
from capstan.security.peers import dial_peer
from capstan.v1 import replication_pb2 as pb
from capstan.v1 import replication_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

ESCAPE_TIMEOUT_S = 10.0


class EscapeBridge:
    """Use from the broker's event loop."""

    def __init__(self, broker_name: str, addresses: list[str]) -> None:
        self.broker_name = broker_name
        self.addresses = addresses
        self._next = 0
        self._channels = ChannelPool(dial_peer)

    async def close(self) -> None:
        await self._channels.close()

    def _stub(self, address: str) -> pb_grpc.ReplicaPeersStub:
        return pb_grpc.ReplicaPeersStub(self._channels.get(address))  # type: ignore[no-untyped-call]

    async def put(self, messages: list[Message]) -> PutResult:
        """Store `messages` on the first escape broker that takes them all."""
        if not self.addresses:
            return PutResult(
                PutStatus.NOT_MASTER,
                detail=f"{self.broker_name} has no master and no replication.escape_addresses",
            )
        request = pb.EscapeRequest(
            from_broker=self.broker_name, messages=[to_handed(m) for m in messages]
        )
        why = []
        for i in range(len(self.addresses)):
            address = self.addresses[(self._next + i) % len(self.addresses)]
            try:
                reply = await self._stub(address).Escape(request, timeout=ESCAPE_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                why.append(f"{address}: {exc.code().name} {exc.details()}")
                continue
            status = PutStatus.__members__.get(reply.status, PutStatus.SERVICE_NOT_AVAILABLE)
            if status.ok:
                self._next = (self._next + i) % len(self.addresses)
                return PutResult(status)
            why.append(f"{address}: {reply.status} {reply.detail}")
        detail = "no escape broker stored the messages: " + "; ".join(why)
        log.warning("%s", detail)
        return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, detail=detail)
