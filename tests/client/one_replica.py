"""A consumer's replica choice where every queue's group is one replica at one address:
for the unit tests of the services that call through `QueueReplicas` with stand-in broker
calls (the real choice over real routes is tested in test_queue_replicas.py)."""

from __future__ import annotations

from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.queue_replicas import QueueReplicas
from capstan.client.route import RouteQueue


class _NoRoutes:
    def refresh_soon(self, topic: str) -> None:
        """Nothing to ask: the one replica is all there is."""


class OneReplica(QueueReplicas):
    def __init__(self, address: str = "b:1") -> None:
        super().__init__(_NoRoutes())  # type: ignore[arg-type]
        self.only = address

    def route_queue(self, queue: MessageQueue) -> RouteQueue | None:
        return RouteQueue(
            queue.topic, queue.broker_name, queue.queue_id, (self.only,), True, True, frozenset()
        )
