"""The brokers of a group without a controller watching each other.

Every `heartbeat_interval_ms` a broker probes each peer (capstan.v1.ReplicaPeers/Probe):
the brokers listed in `replication.peers` and, for a slave, its master. A peer counts as
alive while its last answer is younger than `peer_timeout_ms`; the answer says its id, its
role, whether it acts for an absent master and which master generation it knows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from capstan.common.channel_pool import ChannelPool
from capstan.security.peers import dial_peer
from capstan.v1 import replication_pb2 as pb
from capstan.v1 import replication_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


@dataclass
class Peer:
    address: str
    reply: pb.ProbeReply | None = None
    answered_at: float | None = None
    """When it last answered (monotonic)."""


class PeerWatch:
    """Use from the broker's event loop."""

    def __init__(
        self,
        broker_name: str,
        own_id: int,
        addresses: list[str],
        interval_s: float,
        timeout_s: float,
        after_round: Callable[[], Awaitable[None]],
    ) -> None:
        self.broker_name = broker_name
        self.own_id = own_id
        self.peers = {a: Peer(a) for a in addresses}
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._after_round = after_round
        self._channels = ChannelPool(dial_peer)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="peer-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._channels.close()

    def stub(self, address: str) -> pb_grpc.ReplicaPeersStub:
        return pb_grpc.ReplicaPeersStub(self._channels.get(address))  # type: ignore[no-untyped-call]

    async def _run(self) -> None:
        while True:
            try:
                await self.probe_all(min(self.interval_s * 2, self.timeout_s))
                await self._after_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("watching the group's peers failed; retrying")
            await asyncio.sleep(self.interval_s)

    async def probe_all(self, timeout_s: float) -> None:
        """Probe every peer at once; those that answer within `timeout_s` count as seen."""
        await asyncio.gather(*(self._probe(p, timeout_s) for p in self.peers.values()))

    async def _probe(self, peer: Peer, timeout_s: float) -> None:
        request = pb.ProbeRequest(broker_name=self.broker_name, broker_id=self.own_id)
        try:
            reply = await self.stub(peer.address).Probe(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.INVALID_ARGUMENT:
                log.error("peer %s refused the probe: %s", peer.address, exc.details())
            return
        if reply.broker_name != self.broker_name or reply.broker_id == self.own_id:
            log.error(
                "peer %s is broker %d of %s, not another broker of %s; check replication.peers",
                peer.address,
                reply.broker_id,
                reply.broker_name,
                self.broker_name,
            )
            return
        peer.reply, peer.answered_at = reply, time.monotonic()

    def alive(self) -> list[pb.ProbeReply]:
        """The answers of the peers alive now."""
        now = time.monotonic()
        return [
            p.reply
            for p in self.peers.values()
            if p.reply is not None
            and p.answered_at is not None
            and now - p.answered_at <= self.timeout_s
        ]

    def address_of(self, broker_id: int) -> str:
        for peer in self.peers.values():
            if peer.reply is not None and peer.reply.broker_id == broker_id:
                return peer.address
        return ""
