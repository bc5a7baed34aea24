"""The topic's route over every broker group, as the controller joins it: what a broker
needs to answer QueryAssignment for the whole cluster, not for its own group alone.

The official PushConsumer asks one queue of its route, picked at random, for its
assignments every 5 s, and keeps exactly the queues the answer names. A broker that named
only its own group made a consumer of a topic held by two groups (a static topic, or a
topic created on both) consume one group at a time, switching at each scan; messages on the
other group waited 5, 10, 25 s. So a broker under a controller asks the controller's
QueryRoute (every group's queues, with the client's metadata, as RocketMQ's proxy reads
the whole route) and answers assignments for each group in it. The joined route is kept
`FRESH_S` for the next consumers; when the controller does not answer, the last one is
used for up to `KEPT_S`, and after that the broker answers for its own group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.common.channel_pool import ChannelPool
from capstan.security.peers import dial_for_client, passed_on_behalf

log = logging.getLogger(__name__)

FRESH_S = 1.0
"""A joined route this young is used again without asking the controller."""
KEPT_S = 60.0
"""A joined route is used this long while the controller does not answer."""
CALL_TIMEOUT_S = 2.0
"""Each controller's time to answer (the client's call waits for it)."""

READABLE = (pb.READ, pb.READ_WRITE)


class ClusterRoutes:
    """Use from the broker's event loop only."""

    def __init__(self, controllers: Sequence[str]) -> None:
        self._controllers = list(controllers)
        self._channels = ChannelPool(dial_for_client)
        self._joined: dict[tuple[str, str], tuple[float, list[pb.MessageQueue]]] = {}

    async def close(self) -> None:
        await self._channels.close()

    async def queues(
        self, topic: pb.Resource, endpoints: pb.Endpoints, context: grpc.aio.ServicerContext
    ) -> list[pb.MessageQueue] | None:
        """Every group's queues of `topic`; None when no controller answered and nothing
        joined in the last `KEPT_S` is kept."""
        key = (topic.resource_namespace, topic.name)
        now = time.monotonic()
        kept = self._joined.get(key)
        if kept is not None and now - kept[0] < FRESH_S:
            return kept[1]
        request = svc.QueryRouteRequest(topic=topic, endpoints=endpoints)
        metadata = passed_on_behalf(context)
        for address in self._controllers:
            stub = svc_grpc.MessagingServiceStub(self._channels.get(address))
            try:
                reply = await stub.QueryRoute(request, timeout=CALL_TIMEOUT_S, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                log.debug("route of %s from controller %s: %s", topic.name, address, exc.code())
                continue
            if reply.status.code != pb.OK:
                continue
            queues = list(reply.message_queues)
            self._joined[key] = (time.monotonic(), queues)
            return queues
        if kept is not None and now - kept[0] < KEPT_S:
            return kept[1]
        return None


def other_groups_assignments(
    queues: Sequence[pb.MessageQueue], own_group: str, fifo: bool
) -> list[pb.Assignment]:
    """Assignments for the groups of a joined route other than `own_group`: per group one
    "any queue" assignment (id -1) for a non-FIFO consumer group, else one per readable
    queue (the same rule a group applies to its own queues)."""
    by_group: dict[str, list[pb.MessageQueue]] = {}
    for queue in queues:
        if queue.broker.name != own_group and queue.permission in READABLE:
            by_group.setdefault(queue.broker.name, []).append(queue)
    out: list[pb.Assignment] = []
    for group_queues in by_group.values():
        if fifo:
            out.extend(pb.Assignment(message_queue=q) for q in group_queues)
            continue
        first = group_queues[0]
        writable = any(q.permission == pb.READ_WRITE for q in group_queues)
        any_queue = pb.MessageQueue(
            topic=first.topic,
            id=-1,
            permission=pb.READ_WRITE if writable else pb.READ,
            broker=first.broker,
            accept_message_types=first.accept_message_types,
        )
        out.append(pb.Assignment(message_queue=any_queue))
    return out
