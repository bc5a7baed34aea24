"""Which clients are connected: their settings, heartbeats and Telemetry streams.

Clients are keyed by the `x-mq-client-id` they send on every call. A producer's open
Telemetry stream is how the broker reaches it for transaction check-back. A client may hold
more than one stream to a broker (the official clients open one per endpoint list, and the
access point and a route's replicas may name the same broker); commands go to the newest
stream still open, and one stream ending leaves the others serving. The registry is
the Broker's `ConnectedClients`: the services reach clients through it without a protobuf.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.connected_clients import ClientCounts
from capstan.broker.edge.v2.wire import to_wire
from capstan.broker.store.message import StoredMessage

CLIENT_EXPIRY_S = 120.0
"""A client silent for this long (no heartbeat, no stream) is forgotten."""


@dataclass
class ClientSession:
    client_id: str
    client_type: int = pb.CLIENT_TYPE_UNSPECIFIED
    group: str = ""
    topics: set[str] = field(default_factory=set)
    settings: pb.Settings | None = None
    streams: list[asyncio.Queue[svc.TelemetryCommand | None]] = field(default_factory=list)
    """The outboxes of its open Telemetry streams, oldest first."""
    last_seen: float = field(default_factory=time.monotonic)

    @property
    def outbox(self) -> asyncio.Queue[svc.TelemetryCommand | None] | None:
        """Where a command to the client goes: its newest open stream (None: none open)."""
        return self.streams[-1] if self.streams else None

    def stream_opened(self, outbox: asyncio.Queue[svc.TelemetryCommand | None]) -> None:
        self.streams.append(outbox)

    def stream_closed(self, outbox: asyncio.Queue[svc.TelemetryCommand | None]) -> None:
        if outbox in self.streams:
            self.streams.remove(outbox)

    @property
    def is_producer(self) -> bool:
        return self.client_type == pb.PRODUCER


class ClientRegistry:
    """Live client sessions; use from the broker's event loop only."""

    def __init__(self, store_host: str) -> None:
        """`store_host` is what check-back messages name as the host that stored them."""
        self._sessions: dict[str, ClientSession] = {}
        self._store_host = store_host
        self.streams_ended = False
        """Set by end_streams(): no Telemetry stream stays open."""

    def touch(self, client_id: str) -> ClientSession:
        session = self._sessions.get(client_id)
        if session is None:
            session = self._sessions[client_id] = ClientSession(client_id)
        session.last_seen = time.monotonic()
        return session

    def heartbeat(self, client_id: str, client_type: int, group: str) -> ClientSession:
        session = self.touch(client_id)
        if client_type:
            session.client_type = client_type
        if group:
            session.group = group
        return session

    def apply_settings(self, client_id: str, settings: pb.Settings) -> ClientSession:
        session = self.touch(client_id)
        session.settings = settings
        session.client_type = settings.client_type
        if settings.HasField("publishing"):
            session.topics = {t.name for t in settings.publishing.topics}
        if settings.HasField("subscription"):
            session.group = settings.subscription.group.name
            session.topics = {s.topic.name for s in settings.subscription.subscriptions}
        return session

    def end_streams(self) -> int:
        """End every open Telemetry stream, and any opened later at once (the broker is
        stopping: a client's stream would otherwise hold the stop for the whole grace);
        how many were open."""
        self.streams_ended = True
        ended = 0
        for session in self._sessions.values():
            for outbox in session.streams:
                outbox.put_nowait(None)
                ended += 1
        return ended

    def remove(self, client_id: str) -> None:
        self._sessions.pop(client_id, None)

    def get(self, client_id: str) -> ClientSession | None:
        return self._sessions.get(client_id)

    def expire(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        gone = [
            cid
            for cid, s in self._sessions.items()
            if not s.streams and now - s.last_seen > CLIENT_EXPIRY_S
        ]
        for cid in gone:
            del self._sessions[cid]
        return gone

    def producer_for(self, topic: str, any_producer: bool = True) -> ClientSession | None:
        """A producer with a Telemetry stream open that publishes to `topic`, else (with
        `any_producer`) any; None when there is none."""
        fallback = None
        for session in self._sessions.values():
            if not session.streams or not session.is_producer:
                continue
            if topic in session.topics:
                return session
            fallback = fallback or session
        return fallback if any_producer else None

    def count(self, client_type: int) -> int:
        return sum(1 for s in self._sessions.values() if s.client_type == client_type)

    def counts(self) -> ClientCounts:
        return ClientCounts(
            producers=self.count(pb.PRODUCER),
            consumers=self.count(pb.PUSH_CONSUMER) + self.count(pb.SIMPLE_CONSUMER),
        )

    def check_back(
        self, half: StoredMessage, topic: str, transaction_id: str, any_producer: bool = True
    ) -> bool:
        session = self.producer_for(topic, any_producer)
        outbox = session.outbox if session is not None else None
        if outbox is None:
            return False
        wire = to_wire(half, self._store_host, topic=topic, transactional=True)
        command = svc.TelemetryCommand(
            recover_orphaned_transaction_command=svc.RecoverOrphanedTransactionCommand(
                message=wire, transaction_id=transaction_id
            )
        )
        outbox.put_nowait(command)
        return True

    def sessions(self) -> list[ClientSession]:
        return list(self._sessions.values())
