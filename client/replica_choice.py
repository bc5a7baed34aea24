"""Which replica of a broker group a client calls.

A route names every replica of a group, and any of them serves a client: a replica that is
not the master passes on what is the master's. A client calls the replica that served it
last, starting with the first the route names, and moves on to the next when one cannot be
reached or answers UNAVAILABLE (a dead master, or a slave whose master is gone until the
next is elected), as an official client's channel moves on to the next address (gRPC
pick_first).
"""

from __future__ import annotations

import threading

from capstan.client.route import RouteQueue


class ReplicaChoice:
    """Per broker group, the replica in use; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_use: dict[str, str] = {}

    def address(self, queue: RouteQueue) -> str:
        """The replica to call for `queue`: the one in use if the route still names it,
        else the route's first."""
        with self._lock:
            address = self._in_use.get(queue.broker_name)
        return address if address in queue.addresses else queue.addresses[0]

    def failed(self, queue: RouteQueue, address: str) -> None:
        """`address` could not serve `queue`'s group: use the replica after it next (unless
        another caller has moved on already)."""
        replicas = queue.addresses
        with self._lock:
            current = self._in_use.get(queue.broker_name, replicas[0])
            if current != address or address not in replicas:
                return
            following = replicas[(replicas.index(address) + 1) % len(replicas)]
            self._in_use[queue.broker_name] = following
