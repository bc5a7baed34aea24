"""Which replica a consumer calls for a queue, decided again at every call.

A queue belongs to a broker group, not to an address. Every call a consumer makes for a
queue (a pull, a lock, an offset commit or query, a send-back) asks here for the replica of
that group in use now: the one that served last, if the topic's cached route still names
it, else the route's first (`replica_choice.py`). A call that fails because the replica
could not serve (unreachable, no answer in time, not able to act for the master now) moves
the whole group on to its next replica and asks for the topic's route again in the
background; `call` then tries that replica at once, each replica once per call. So no queue
stays bound to an address that failed, and a replica that is gone for good costs one failed
call: the route leaves it out once the controller counts it dead.

Reads of stored messages are served by any replica; a replica that is not the master passes
on what is the master's to decide (locks, offsets, send-backs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.errors import ClientError
from capstan.client.replica_choice import ReplicaChoice
from capstan.client.route import RouteCache, RouteQueue

log = logging.getLogger(__name__)

R = TypeVar("R")


def moves_on(error: ClientError) -> bool:
    """Whether another replica may serve what this one failed: it was unreachable, gave no
    answer in time, or could not act now (not the master and no master to pass it on to).
    A refusal of the request itself would be refused by every replica."""
    return error.retriable


class QueueReplicas:
    """A consumer's queues → the replica of their group to call; thread-safe."""

    def __init__(self, route: RouteCache) -> None:
        self._route = route
        self._choice = ReplicaChoice()

    def route_queue(self, queue: MessageQueue) -> RouteQueue | None:
        """The cached route's entry for the queue, or one of its group's (a queue the
        route no longer names is still served by its group, and a group it stopped naming a
        moment ago is still reached for what was consumed there: RouteCache.group_entry);
        None when the topic's route names the group nowhere."""
        entries = self._route.cached(queue.topic)
        if entries is None:
            try:
                entries = self._route.queues(queue.topic)
            except ClientError as exc:
                log.warning("no route for %s: %s", queue, exc)
                return None
        same_group = None
        for entry in entries:
            if entry.broker_name == queue.broker_name:
                if entry.queue_id == queue.queue_id:
                    return entry
                same_group = same_group or entry
        return same_group or self._route.group_entry(queue.topic, queue.broker_name)

    def address(self, queue: MessageQueue) -> str | None:
        """The replica to call for the queue now; None when no route names its group."""
        entry = self.route_queue(queue)
        return self._choice.address(entry) if entry is not None else None

    def replicas(self, queue: MessageQueue) -> int:
        """How many replicas the route names for the queue's group (0: none)."""
        entry = self.route_queue(queue)
        return len(entry.addresses) if entry is not None else 0

    def failed(self, queue: MessageQueue, address: str) -> None:
        """`address` could not serve the queue's group: its next replica serves from now
        on, and the topic's route is asked for again."""
        entry = self.route_queue(queue)
        if entry is not None:
            self._choice.failed(entry, address)
        self._route.refresh_soon(queue.topic)

    def ask_route(self, queue: MessageQueue) -> None:
        """Ask for the queue's topic's route again, in the background."""
        self._route.refresh_soon(queue.topic)

    def call(self, queue: MessageQueue, what: str, attempt: Callable[[str], R]) -> R:
        """`attempt(address)` on the queue's replica in use, and on each next replica of its
        group while they fail in a way another may not (`moves_on`); the last failure
        when every replica failed. Raises ClientError."""
        tried: set[str] = set()
        while True:
            address = self.address(queue)
            if address is None:
                raise ClientError(f"no broker serves {queue} ({what})", "NO_ROUTE")
            tried.add(address)
            try:
                return attempt(address)
            except ClientError as exc:
                if not moves_on(exc):
                    raise
                self.failed(queue, address)
                following = self.address(queue)
                if following is None or following in tried:
                    raise
                log.info("%s of %s failed at %s (%s)", what, queue, address, exc)

    def call_each_group(
        self,
        queues: list[MessageQueue],
        what: str,
        attempt: Callable[[str, list[MessageQueue]], R],
    ) -> dict[str, R | ClientError]:
        """`attempt(address, its queues)` once per broker group of `queues`, as `call`
        does; each group's answer, or the ClientError it ended with."""
        grouped: dict[str, list[MessageQueue]] = {}
        for queue in queues:
            grouped.setdefault(queue.broker_name, []).append(queue)
        answers: dict[str, R | ClientError] = {}
        for name, part in grouped.items():

            def one(address: str, part: list[MessageQueue] = part) -> R:
                return attempt(address, part)

            try:
                answers[name] = self.call(part[0], what, one)
            except ClientError as exc:
                answers[name] = exc
        return answers
