"""QueryRoute and QueryAssignment: which queues a client sees, and where they live.

A single broker lists every queue of the topic as served by itself (broker id 0) at the
endpoints the client used to reach it, so a client always comes back the way it came.
"""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.broker.store.topic_config import MessageType, TopicConfig

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
) -> list[pb.MessageQueue]:
    """One MessageQueue per queue id, with the permission that id has (read-only while the
    group takes no writes: a slave acting for an absent master)."""
    broker = pb.Broker(name=broker_name, id=0, endpoints=endpoints)
    resource = pb.Resource(resource_namespace=namespace, name=topic.name)
    types = accepted_types(topic)
    out = []
    for qid in range(max(topic.read_queue_nums, topic.write_queue_nums)):
        perm = _permission(
            topic.readable and qid < topic.read_queue_nums,
            group_writable and topic.writable and qid < topic.write_queue_nums,
        )
        out.append(
            pb.MessageQueue(
                topic=resource, id=qid, permission=perm, broker=broker, accept_message_types=types
            )
        )
    return out


def assignments(
    topic: TopicConfig, broker_name: str, endpoints: pb.Endpoints, fifo: bool, namespace: str = ""
) -> list[pb.Assignment]:
    """Non-FIFO groups get one "any queue" assignment (id -1); FIFO groups one per queue,
    so each queue is consumed by one receive loop in order."""
    if not topic.readable or topic.read_queue_nums == 0:
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
        for q in route_queues(topic, broker_name, endpoints, namespace)
        if q.id < topic.read_queue_nums
    ]


def endpoints_for(request_endpoints: pb.Endpoints, fallback_host: str, port: int) -> pb.Endpoints:
    """The endpoints to put in routes: the client's own when it sent usable ones."""
    if request_endpoints.addresses:
        return request_endpoints
    return pb.Endpoints(scheme=pb.IPv4, addresses=[pb.Address(host=fallback_host, port=port)])


def group_endpoints(addresses: list[str]) -> pb.Endpoints:
    """One Endpoints naming every replica of a broker group (host:port each)."""
    found = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        found.append(pb.Address(host=host, port=int(port)))
    return pb.Endpoints(scheme=pb.IPv4, addresses=found)
