"""Topic routes as an official RocketMQ 5 client uses them: QueryRoute at the access point
(the controller, or one broker), then calls to the broker groups the route names.

A route names every replica of a group, and a replica that is not the master passes calls
on to it. So a group's calls go to the replica that answered last, and move on to the next
when one cannot be reached or answers UNAVAILABLE (what a slave says while its master is
gone and the controller has not yet elected another), round after round, until the group
answers or `FAILOVER_WINDOW_S` has passed: a command keeps working through a master's
kill -9. A group none of whose replicas even accepts a connection is down at once.
"""

from __future__ import annotations

import ipaddress
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.commands import reach
from capstan.commands.output import CommandError
from capstan.commands.probe import accepts_connections
from capstan.common.grpc_limits import MESSAGE_SIZE_OPTIONS

FAILOVER_WINDOW_S = 30.0
"""How long a call keeps going round a group's replicas while one of them is up but none
serves (a master's death, until the next is elected: seconds), in seconds."""

CALL_TIMEOUT_S = 10.0
RETRY_PAUSE_S = 0.3

T = TypeVar("T")


@dataclass(frozen=True)
class BrokerRoute:
    """A broker group as a route names it: its name and every replica's HOST:PORT."""

    name: str
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class QueueRoute:
    broker: BrokerRoute
    queue_id: int
    readable: bool
    writable: bool


class GroupDown(CommandError):
    """No replica of a broker group accepts connections."""


# -- routes (pure) -------------------------------------------------------------------------


def endpoints_of(host: str, port: int) -> pb.Endpoints:
    """The access point as QueryRoute wants it (a standalone broker routes back to it)."""
    try:
        scheme = pb.IPv6 if ipaddress.ip_address(host).version == 6 else pb.IPv4
    except ValueError:
        scheme = pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])


def address_of(address: pb.Address) -> str:
    host = f"[{address.host}]" if ":" in address.host else address.host
    return f"{host}:{address.port}"


def parse_route(queues: Iterable[pb.MessageQueue]) -> list[QueueRoute]:
    out = []
    for q in queues:
        broker = BrokerRoute(
            q.broker.name, tuple(address_of(a) for a in q.broker.endpoints.addresses)
        )
        readable = q.permission in (pb.READ, pb.READ_WRITE)
        writable = q.permission in (pb.WRITE, pb.READ_WRITE)
        out.append(QueueRoute(broker, q.id, readable, writable))
    return sorted(out, key=lambda q: (q.broker.name, q.queue_id))


def writable_queues(route: Sequence[QueueRoute]) -> list[QueueRoute]:
    return [q for q in route if q.writable and q.broker.addresses]


def readable_brokers(route: Sequence[QueueRoute]) -> list[BrokerRoute]:
    found = {q.broker.name: q.broker for q in route if q.readable and q.broker.addresses}
    return [found[name] for name in sorted(found)]


def pick_queue(queues: Sequence[QueueRoute], message_group: str, turn: int) -> QueueRoute:
    """A message group always maps to the same queue (CRC32 modulo the writable queues, as
    a broker picks for a sender that names none); other messages take turns."""
    if message_group:
        return queues[zlib.crc32(message_group.encode()) % len(queues)]
    return queues[turn % len(queues)]


# -- calls -----------------------------------------------------------------------------------


def query_route(
    server: str, topic: str, command: str, metadata: Sequence[tuple[str, str]]
) -> list[QueueRoute]:
    """The topic's queues, asked of `server` (a CommandError when it refuses)."""
    request = svc.QueryRouteRequest(
        topic=pb.Resource(name=topic), endpoints=endpoints_of(*reach.split_address(server))
    )
    with grpc.insecure_channel(server) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        reply = reach.call(
            server,
            reach.messaging_need(command),
            lambda: stub.QueryRoute(request, metadata=metadata, timeout=CALL_TIMEOUT_S),
        )
    if reply.status.code != pb.OK:
        raise CommandError(
            f"route of topic {topic}: {pb.Code.Name(reply.status.code)}: {reply.status.message}"
        )
    return parse_route(reply.message_queues)


class Replicas:
    """Calls to one broker group, going round its replicas as the module says."""

    def __init__(self, broker: BrokerRoute, window_s: float = FAILOVER_WINDOW_S) -> None:
        self.broker = broker
        self._window_s = window_s
        self._channels: dict[str, grpc.Channel] = {}
        self._current = 0
        self._said_waiting = False

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def _stub(self, address: str) -> svc_grpc.MessagingServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.insecure_channel(address, options=MESSAGE_SIZE_OPTIONS)
            self._channels[address] = channel
        return svc_grpc.MessagingServiceStub(channel)

    def call(self, run: Callable[[svc_grpc.MessagingServiceStub], T]) -> T:
        """`run` on the replica that answered last, or the next ones, as the module says."""
        deadline = time.monotonic() + self._window_s
        while True:
            failures = []
            for _ in self.broker.addresses:
                address = self.broker.addresses[self._current]
                try:
                    return run(self._stub(address))
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        detail = exc.details() or exc.code().name
                        raise CommandError(
                            f"broker group {self.broker.name} at {address}: {detail}"
                        ) from None
                    failures.append((address, str(exc.details())))
                self._current = (self._current + 1) % len(self.broker.addresses)
            self._give_up_or_wait(failures, deadline)

    def _give_up_or_wait(self, failures: list[tuple[str, str]], deadline: float) -> None:
        reasons = "; ".join(f"{address}: {detail}" for address, detail in failures)
        if not any(accepts_connections(*reach.split_address(a)) for a, _ in failures):
            raise GroupDown(
                f"no replica of broker group {self.broker.name} can be reached ({reasons})"
            )
        if time.monotonic() >= deadline:
            waited = f"{self._window_s:.0f} s"
            raise CommandError(
                f"broker group {self.broker.name} did not serve in {waited} ({reasons})"
            )
        if not self._said_waiting:
            self._said_waiting = True
            print(
                f"waiting for broker group {self.broker.name}: {reasons}",
                file=sys.stderr,
                flush=True,
            )
        time.sleep(RETRY_PAUSE_S)
