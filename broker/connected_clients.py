"""What the broker's services need of the clients connected through the protocol edge.

Sessions, their settings and their Telemetry streams are `apache.rocketmq.v2` things and
live at the edge (`edge/v2/clients.py`); the services see only this hook, which the edge
registers on the Broker, so a check-back or a client count never names a protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from capstan.broker.store.message import StoredMessage


@dataclass(frozen=True, slots=True)
class ClientCounts:
    producers: int = 0
    consumers: int = 0


class ConnectedClients(Protocol):
    def expire(self) -> object:
        """Forget the clients that went silent."""

    def counts(self) -> ClientCounts: ...

    def check_back(
        self, half: StoredMessage, topic: str, transaction_id: str, any_producer: bool = True
    ) -> bool:
        """Ask a producer of `topic` (with `any_producer`, failing that any producer) to
        decide the half message `half` (stored under the half topic); False when no
        producer can be asked."""


class NoClients:
    """Before the edge registers its sessions (and in tests without one): nobody."""

    def expire(self) -> object:
        return None

    def counts(self) -> ClientCounts:
        return ClientCounts()

    def check_back(
        self, half: StoredMessage, topic: str, transaction_id: str, any_producer: bool = True
    ) -> bool:
        return False
