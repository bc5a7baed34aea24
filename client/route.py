"""Topic routes: which queues a topic has, on which broker group, at which address.

A topic's route is the union of what every configured endpoint answers to QueryRoute,
deduplicated by (broker name, queue id). Today each broker lists only its own queues, so a
client configured with every broker sees them all; a controller endpoint that lists every
broker group fits the same rule. An endpoint that is down is skipped. Routes are cached and
refreshed in the background, so brokers that come and go are noticed without a restart; a
client that found a replica gone asks for a topic's route at once (`refresh_soon`), as
routes leave out the replicas the controller counts dead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.client import wire
from capstan.client.channels import ChannelPool, call_metadata
from capstan.client.errors import (
    ClientError,
    TopicNotFound,
    TransportError,
    from_rpc_error,
    from_status,
)
from capstan.client.message import MessageType
from capstan.common.key_routing import routes_by_key

log = logging.getLogger(__name__)

QUERY_TIMEOUT_S = 3.0
"""Deadline of one QueryRoute call, in seconds."""
LEFT_KEPT_S = 300.0
"""How long a broker group a topic's refreshed route no longer names is still reached at
the addresses it had, for what a client holds of it: an ack of a message it handed out, an
offset commit of a queue consumed there (a static topic's logic queue moved away)."""
SOON_GAP_S = 0.5
"""Least time between two asked-for refreshes of one topic, in seconds: a burst of failed
calls to one replica asks the endpoints once."""

_READABLE = frozenset({pb.READ, pb.READ_WRITE})
_WRITABLE = frozenset({pb.WRITE, pb.READ_WRITE})


@dataclass(frozen=True, slots=True)
class RouteQueue:
    """One queue of a topic on one broker group."""

    topic: str
    broker_name: str
    queue_id: int
    addresses: tuple[str, ...]
    """Where its broker group answers, "host:port" each: every replica the route names (any
    of them serves a client, passing on to the master what is the master's)."""
    readable: bool
    writable: bool
    accepted_types: frozenset[MessageType]
    """The message types the topic accepts (a MIXED topic accepts all four)."""
    by_key: bool = False
    """Whether a keyed message goes to its key's queue (a compact topic;
    capstan/common/key_routing.py)."""

    @property
    def address(self) -> str:
        """The replica the route names first."""
        return self.addresses[0]


def _route_queue(topic: str, mq: pb.MessageQueue, dialled: str, by_key: bool) -> RouteQueue:
    return RouteQueue(
        topic=topic,
        broker_name=str(mq.broker.name),
        queue_id=int(mq.id),
        addresses=wire.addresses(mq.broker.endpoints) or (dialled,),
        readable=mq.permission in _READABLE,
        writable=mq.permission in _WRITABLE,
        accepted_types=wire.message_types(mq.accept_message_types),
        by_key=by_key,
    )


class RouteCache:
    """Topic → its queues, sorted by (broker name, queue id); thread-safe.

    `queues()` answers from the cache and asks the endpoints on a miss; `start()` runs a
    daemon thread that re-asks for every cached topic every `refresh_s` seconds.
    """

    def __init__(
        self,
        endpoints: list[str],
        channels: ChannelPool,
        client_id: str,
        refresh_s: float = 30.0,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one endpoint (host:port) is needed")
        for address in endpoints:
            wire.split_address(address)  # a malformed endpoint fails here, not on first use
        if refresh_s <= 0:
            raise ValueError("refresh_s must be positive")
        self._endpoints = list(dict.fromkeys(endpoints))
        self._channels = channels
        self._metadata = call_metadata(client_id)
        self._refresh_s = refresh_s
        self._lock = threading.Lock()
        self._routes: dict[str, list[RouteQueue]] = {}
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._soon: set[str] = set()
        self._asked_at: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._watchers: list[Callable[[str], None]] = []
        self._left: dict[tuple[str, str], tuple[float, RouteQueue]] = {}
        """(topic, broker group) -> (when, an entry of it) for the groups a refresh took
        out of the topic's route (`left_group`)."""

    # -- lookups -----------------------------------------------------------------------

    def queues(self, topic: str) -> list[RouteQueue]:
        """Every queue of the topic. Raises TopicNotFound when no endpoint knows it, and
        TransportError (retriable) when none that might know it could be reached."""
        with self._lock:
            cached = self._routes.get(topic)
        if cached is not None:
            return cached
        fresh = self._query(topic)
        with self._lock:
            self._routes[topic] = fresh
        return fresh

    def write_queues(self, topic: str) -> list[RouteQueue]:
        return [q for q in self.queues(topic) if q.writable]

    def read_queues(self, topic: str) -> list[RouteQueue]:
        return [q for q in self.queues(topic) if q.readable]

    def cached(self, topic: str) -> list[RouteQueue] | None:
        """The cached queues of the topic, or None; never calls a broker."""
        with self._lock:
            return self._routes.get(topic)

    def group_entry(self, topic: str, broker_name: str) -> RouteQueue | None:
        """An entry of the group in the topic's cached route; for a group the route named
        within the last LEFT_KEPT_S and no longer does, the entry it had; else None."""
        with self._lock:
            for entry in self._routes.get(topic) or ():
                if entry.broker_name == broker_name:
                    return entry
            left = self._left.get((topic, broker_name))
        if left is None or time.monotonic() - left[0] > LEFT_KEPT_S:
            return None
        return left[1]

    def invalidate(self, topic: str) -> None:
        """Forget the topic's route; the next lookup asks the endpoints again."""
        with self._lock:
            self._routes.pop(topic, None)

    def topics(self) -> list[str]:
        with self._lock:
            return list(self._routes)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._refresh_routine, name="capstan-route-refresh", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(QUERY_TIMEOUT_S + 1)

    def watch(self, changed: Callable[[str], None]) -> None:
        """Call `changed(topic)` whenever a refresh finds the topic's readable queues
        changed (a group came or went, a static logic queue moved): a consumer rebalances
        then rather than at its next interval."""
        self._watchers.append(changed)

    def refresh_soon(self, topic: str) -> None:
        """Ask for the topic's route in the background, now (a call to one of its
        replicas failed): at most once per SOON_GAP_S, and only once `start()`ed."""
        with self._lock:
            self._soon.add(topic)
        self._wake.set()

    def _refresh_routine(self) -> None:
        due = time.monotonic() + self._refresh_s
        while not self._stopping.is_set():
            self._wake.wait(max(0.0, min(due, self._next_asked()) - time.monotonic()))
            if self._stopping.is_set():
                return
            self._wake.clear()
            if time.monotonic() >= due:
                due = time.monotonic() + self._refresh_s
                for topic in self.topics():
                    self.refresh(topic)
            self._refresh_asked()

    def _next_asked(self) -> float:
        """When the earliest topic `refresh_soon` named may be asked for (infinity: none)."""
        with self._lock:
            return min(
                (self._asked_at.get(t, -SOON_GAP_S) + SOON_GAP_S for t in self._soon),
                default=float("inf"),
            )

    def _refresh_asked(self) -> None:
        """The topics `refresh_soon` named, each unless it was asked within SOON_GAP_S
        (the routine comes back for those when their gap has passed)."""
        now = time.monotonic()
        with self._lock:
            gap = SOON_GAP_S
            ready = {t for t in self._soon if now >= self._asked_at.get(t, -gap) + gap}
            self._soon -= ready
            for topic in ready:
                self._asked_at[topic] = now
        for topic in sorted(ready):
            self.refresh(topic)

    def refresh(self, topic: str) -> None:
        """Ask the endpoints for the topic's route now. A topic no endpoint knows any more
        is dropped from the cache; when no endpoint answers, the old route is kept."""
        try:
            fresh = self._query(topic)
        except TopicNotFound:
            log.info("topic %s is gone from every endpoint; forgetting its route", topic)
            self.invalidate(topic)
        except ClientError as exc:
            log.warning("could not refresh the route of %s, keeping the old one: %s", topic, exc)
        else:
            with self._lock:
                old = self._routes.get(topic)
                if old is not None:
                    self._routes[topic] = fresh
                    self._remember_left(topic, old, fresh)
            if old is not None and _readable(old) != _readable(fresh):
                for changed in self._watchers:
                    changed(topic)

    def _remember_left(self, topic: str, old: list[RouteQueue], fresh: list[RouteQueue]) -> None:
        """Keep an entry of each group `old` named and `fresh` does not (under the lock)."""
        now = time.monotonic()
        named = {q.broker_name for q in fresh}
        for entry in old:
            if entry.broker_name not in named:
                self._left[(topic, entry.broker_name)] = (now, entry)
        for key in [k for k, (at, _) in self._left.items() if now - at > LEFT_KEPT_S]:
            del self._left[key]
        for name in named:
            self._left.pop((topic, name), None)

    # -- asking the endpoints ----------------------------------------------------------

    def _query(self, topic: str) -> list[RouteQueue]:
        """The union of every answering endpoint's route, asked in parallel."""
        calls = []
        for address in self._endpoints:
            stub = svc_grpc.MessagingServiceStub(self._channels.get(address))
            request = svc.QueryRouteRequest(
                topic=pb.Resource(name=topic), endpoints=wire.endpoints(address)
            )
            calls.append(
                (
                    address,
                    stub.QueryRoute.future(
                        request, timeout=QUERY_TIMEOUT_S, metadata=self._metadata
                    ),
                )
            )
        answers: list[tuple[str, svc.QueryRouteResponse]] = []
        refused: list[ClientError] = []
        down: list[ClientError] = []
        by_key = False
        for address, call in calls:
            context = f"QueryRoute {topic} at {address}"
            try:
                response = call.result()
            except grpc.RpcError as exc:
                down.append(from_rpc_error(exc, context))
                continue
            if response.status.code != pb.OK:
                refused.append(from_status(response.status, context))
                continue
            answers.append((address, response))
            by_key = by_key or routes_by_key(call.trailing_metadata())
        if not answers:
            raise _no_route(topic, refused, down)
        found: dict[tuple[str, int], RouteQueue] = {}
        for address, response in answers:
            for mq in response.message_queues:
                q = _route_queue(topic, mq, address, by_key)
                found.setdefault((q.broker_name, q.queue_id), q)
        return sorted(found.values(), key=lambda q: (q.broker_name, q.queue_id))


def _no_route(topic: str, refused: list[ClientError], down: list[ClientError]) -> ClientError:
    """Why no queue was found: a refusal other than "not found" wins; "not found" counts
    only when every endpoint said so, as an endpoint that is down may know the topic."""
    for error in refused:
        if not isinstance(error, TopicNotFound):
            return error
    if refused and not down:
        return TopicNotFound(f"no endpoint knows topic {topic!r}", "TOPIC_NOT_FOUND")
    if len(down) == 1 and not refused:
        return down[0]  # the one endpoint's own failure, as it was
    reasons = "; ".join(str(e) for e in down)
    return TransportError(
        f"no endpoint that might know topic {topic!r} answered: {reasons}",
        down[0].code if down else "UNAVAILABLE",
    )


def _readable(queues: list[RouteQueue]) -> set[tuple[str, int]]:
    """(group, queue id) of each readable queue: what a consumer's rebalance divides."""
    return {(q.broker_name, q.queue_id) for q in queues if q.readable}
