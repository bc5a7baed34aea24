"""Transaction check-backs that reach producers connected to another replica.

A producer's Telemetry stream is its only way in, and it lives on whichever replica of the
group the stream reached (routes name them all; a Kubernetes Service picks one; the
official clients stick to the one that answered). Streams are served where they land, so
they outlive the master: when a slave takes over, the producers whose streams ran through
it can still be asked. The master, or the slave acting for it, asks its own producers
first; for a half message none of them can answer, it asks the other replicas in turn
(capstan.v1.ReplicaPeers/CheckBack), the one that last had a producer first, and each
passes the check-back to a producer connected to it. A producer of the half message's
topic is looked for on every replica before any other producer is asked (the official
clients' producer group is the topic). The producer's answer, an
EndTransaction, comes back through whichever replica it reaches and is passed on to the
master like every other call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc

from capstan.common.channel_pool import ChannelPool
from capstan.security.peers import dial_peer
from capstan.v1 import replication_pb2 as pb
from capstan.v1 import replication_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

CHECK_BACK_TIMEOUT_S = 2.0
"""How long one replica gets to say whether it passed a check-back on."""

UNREACHABLE_PAUSE_S = 10.0
"""A replica that did not answer is not asked again for this long, so a pass over many
half messages does not wait on a dead or hung replica for each of them."""


class CheckBackRelay:
    """Use from the broker's event loop."""

    def __init__(self, broker_name: str, peers: Callable[[], list[str]]) -> None:
        """`peers` gives the other replicas' addresses (not this broker's own)."""
        self._name = broker_name
        self._peers = peers
        self._last: dict[str, str] = {}
        """topic -> the replica that last passed one of its check-backs on."""
        self._unreachable_until: dict[str, float] = {}
        self._channels = ChannelPool(dial_peer)

    async def close(self) -> None:
        await self._channels.close()

    def _order(self, topic: str) -> list[str]:
        now = time.monotonic()
        peers = [p for p in self._peers() if self._unreachable_until.get(p, 0.0) <= now]
        last = self._last.get(topic)
        if last in peers:
            peers.remove(last)
            peers.insert(0, last)
        return peers

    async def ask(
        self, half_record: bytes, topic: str, transaction_id: str, any_producer: bool
    ) -> str:
        """Have a producer of `topic` (with `any_producer`, failing that any producer)
        connected to another replica decide the half message stored as `half_record`; the
        replica that asked one, "" when none could."""
        request = pb.CheckBackRequest(
            broker_name=self._name,
            topic=topic,
            transaction_id=transaction_id,
            half_record=half_record,
            any_producer=any_producer,
        )
        for address in self._order(topic):
            stub = pb_grpc.ReplicaPeersStub(self._channels.get(address))  # type: ignore[no-untyped-call]
            try:
                reply = await stub.CheckBack(request, timeout=CHECK_BACK_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                log.info(
                    "check-back through %s failed (%s); not asking it for %.0f s",
                    address,
                    exc.code().name,
                    UNREACHABLE_PAUSE_S,
                )
                self._unreachable_until[address] = time.monotonic() + UNREACHABLE_PAUSE_S
                continue
            if reply.asked:
                self._last[topic] = address
                return address
        return ""
