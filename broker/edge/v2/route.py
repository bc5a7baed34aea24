"""QueryRoute and QueryAssignment: which queues a client sees, and where they live.

A single broker lists every queue of the topic as served by itself (broker id 0) at the
endpoints the client used to reach it, so a client always comes back the way it came.
Under a controller every replica of the group is listed, and any of them serves a client.
A compact topic's route says, in a trailer, that keyed messages go to their key's queue
(capstan/common/key_routing.py). A static topic's route lists the logic queues whose last
item is on this group (broker/static_topics.py): the controller's route then names each
logic queue once, on the group that leads it (or is taking it over), which serves all its
reads. Under a controller, QueryAssignment answers for every
group that holds the topic (broker/edge/v2/cluster_routes.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.catalog import Catalog
from capstan.broker.edge.v2 import validation
from capstan.broker.edge.v2.cluster_routes import ClusterRoutes, other_groups_assignments
from capstan.broker.edge.v2.codes import RequestError, ok
from capstan.broker.static_topics import StaticTopics, StaticView
from capstan.broker.store.compaction import is_compact
from capstan.broker.store.topic_config import MessageType, TopicConfig
from capstan.common.key_routing import BY_KEYS, KEY_ROUTING_METADATA


@dataclass(frozen=True)
class GroupView:
    """What routes say about this broker and its group."""

    broker_name: str
    port: int
    """The gRPC port this broker serves on."""
    advertised_host: str
    """The host routes name when the client did not say how it reached us ("" if unset)."""
    replicas: Callable[[], list[str]]
    """Every replica's host:port, empty for a broker alone (the Broker's group_addresses)."""
    writable: Callable[[], bool]
    """Whether the group takes writes now (not while a slave acts for its master)."""
    route_endpoint: str = ""
    """host:port routes name instead of the replicas (settings.route_endpoint) for a client
    that did not say how it reached us."""


class RouteHandler:
    def __init__(
        self,
        catalog: Catalog,
        group: GroupView,
        static: StaticTopics,
        cluster: ClusterRoutes | None = None,
    ) -> None:
        """`cluster` joins every group's route (a broker under a controller): assignments
        then name every group that holds the topic."""
        self._catalog = catalog
        self._group = group
        self._static = static
        self._cluster = cluster

    def _endpoints(
        self, request_endpoints: pb.Endpoints, context: grpc.aio.ServicerContext
    ) -> pb.Endpoints:
        if self._group.route_endpoint:
            # Every replica behind the endpoint serves a client, so the way the client came
            # (a NodePort, a port-forward, a load balancer) is as good and, from outside the
            # cluster, the only one that resolves.
            if request_endpoints.addresses:
                return request_endpoints
            return group_endpoints([self._group.route_endpoint])
        replicas = self._group.replicas()
        if replicas:  # under a controller: every replica; any of them serves the client
            return group_endpoints(replicas)
        host = self._group.advertised_host or _dialled_host(context) or "127.0.0.1"
        return endpoints_for(request_endpoints, host, self._group.port)

    async def query_route(
        self, request: svc.QueryRouteRequest, context: grpc.aio.ServicerContext
    ) -> svc.QueryRouteResponse:
        topic = validation.existing_topic(self._catalog, request.topic, create=True)
        queues = route_queues(
            topic,
            self._group.broker_name,
            self._endpoints(request.endpoints, context),
            request.topic.resource_namespace,
            self._group.writable(),
            self._static.view(topic.name),
        )
        if is_compact(topic):  # the client sends a keyed message to its key's queue
            context.set_trailing_metadata(((KEY_ROUTING_METADATA, BY_KEYS),))
        return svc.QueryRouteResponse(status=ok(), message_queues=queues)

    async def query_assignment(
        self, request: svc.QueryAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> svc.QueryAssignmentResponse:
        validation.topic_name(request.topic)  # both names before either lookup
        validation.group_name(request.group)
        group = validation.existing_group(self._catalog, request.group)
        topic = validation.existing_topic(self._catalog, request.topic)
        fifo = group.consume_message_orderly
        found = assignments(
            topic,
            self._group.broker_name,
            self._endpoints(request.endpoints, context),
            fifo,
            request.topic.resource_namespace,
            self._static.view(topic.name),
        )
        if self._cluster is not None:
            joined = await self._cluster.queues(request.topic, request.endpoints, context)
            if joined is not None:
                found.extend(other_groups_assignments(joined, self._group.broker_name, fifo))
        if not found:
            raise RequestError(pb.FORBIDDEN, f"topic {topic.name!r} has no readable queue")
        return svc.QueryAssignmentResponse(status=ok(), assignments=found)


def _dialled_host(context: grpc.aio.ServicerContext) -> str | None:
    """The host the client dialled, from the :authority it sent."""
    for key, value in context.invocation_metadata() or ():
        if key == ":authority":
            return str(value).rsplit(":", 1)[0]
    return None


_ACCEPTS: dict[MessageType, list[int]] = {
    MessageType.NORMAL: [pb.NORMAL],
    MessageType.FIFO: [pb.FIFO],
    MessageType.DELAY: [pb.DELAY],
    MessageType.TRANSACTION: [pb.TRANSACTION],
    MessageType.MIXED: [pb.NORMAL, pb.FIFO, pb.DELAY, pb.TRANSACTION],
}


def accepted_types(topic: TopicConfig) -> list[int]:
    return _ACCEPTS[topic.message_type]


def _permission(readable: bool, writable: bool) -> int:
    if readable and writable:
        return pb.READ_WRITE
    if readable:
        return pb.READ
    if writable:
        return pb.WRITE
    return pb.NONE


def route_queues(
    topic: TopicConfig,
    broker_name: str,
    endpoints: pb.Endpoints,
    namespace: str = "",
    group_writable: bool = True,
    static: StaticView | None = None,
) -> list[pb.MessageQueue]:
    """One MessageQueue per queue id, with the permission that id has (read-only while the
    group takes no writes: a slave acting for an absent master). For a static topic, the
    logic queues whose last item is here (broker/static_topics.py `fronted`), writable
    where this group leads them: each logic queue is named on one group, which serves
    every read of it, its older items' too."""
    broker = pb.Broker(name=broker_name, id=0, endpoints=endpoints)
    resource = pb.Resource(resource_namespace=namespace, name=topic.name)
    types = accepted_types(topic)
    if static is None:
        ids: Sequence[int] = range(max(topic.read_queue_nums, topic.write_queue_nums))
        write_ids: Container[int] = range(topic.write_queue_nums)
    else:
        ids, write_ids = static.fronted, static.led
    out = []
    for qid in ids:
        perm = _permission(
            topic.readable and qid < topic.read_queue_nums,
            group_writable and topic.writable and qid in write_ids,
        )
        out.append(
            pb.MessageQueue(
                topic=resource, id=qid, permission=perm, broker=broker, accept_message_types=types
            )
        )
    return out


def assignments(
    topic: TopicConfig,
    broker_name: str,
    endpoints: pb.Endpoints,
    fifo: bool,
    namespace: str = "",
    static: StaticView | None = None,
) -> list[pb.Assignment]:
    """Non-FIFO groups get one "any queue" assignment (id -1); FIFO groups one per queue,
    so each queue is consumed by one receive loop in order (for a static topic, per logic
    queue this group fronts)."""
    if not topic.readable or topic.read_queue_nums == 0:
        return []
    if static is not None and not static.fronted:
        return []
    if not fifo:
        broker = pb.Broker(name=broker_name, id=0, endpoints=endpoints)
        queue = pb.MessageQueue(
            topic=pb.Resource(resource_namespace=namespace, name=topic.name),
            id=-1,
            permission=pb.READ_WRITE if topic.writable else pb.READ,
            broker=broker,
            accept_message_types=accepted_types(topic),
        )
        return [pb.Assignment(message_queue=queue)]
    return [
        pb.Assignment(message_queue=q)
        for q in route_queues(topic, broker_name, endpoints, namespace, static=static)
        if q.id < topic.read_queue_nums
    ]


def endpoints_for(request_endpoints: pb.Endpoints, fallback_host: str, port: int) -> pb.Endpoints:
    """The endpoints to put in routes: the client's own when it sent usable ones."""
    if request_endpoints.addresses:
        return request_endpoints
    return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=fallback_host, port=port)])


def group_endpoints(addresses: list[str]) -> pb.Endpoints:
    """One Endpoints naming every replica of a broker group (host:port each). Clients take
    a single address with a host name (DOMAIN_NAME), so replicas known by name are named by
    the first of them."""
    found = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        found.append(pb.Address(host=host, port=int(port)))
    if any(not _is_ip(a.host) for a in found):
        return pb.Endpoints(scheme=pb.DOMAIN_NAME, addresses=found[:1])
    return pb.Endpoints(scheme=pb.IPv4, addresses=found)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True
