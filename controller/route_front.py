"""The controller as the clients' access point, like RocketMQ's name server: it answers the
v2 QueryRoute with the routes of every broker group that has the topic.

A client configured with the controller's address (rather than one broker's) asks here for
routes, then talks to the brokers they name; so it can start, and refresh its routes, while
any one broker is down. Each group's route comes from one of its live replicas (the master
first): every replica answers QueryRoute and names all replicas of its group. A topic is
"not found" only when every group says so: while a group that may have it cannot be
reached, the answer is an error a client keeps its cached route through. A group's
trailer saying the topic routes by key is passed on (capstan/common/key_routing.py).
Heartbeat and NotifyClientTermination are answered OK; everything else belongs to the
brokers and is answered UNIMPLEMENTED here, naming the method (never NotImplementedError,
which grpc logs with a traceback).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.common.channel_pool import ChannelPool
from capstan.common.grpc_services import answer_unimplemented
from capstan.common.key_routing import BY_KEYS, KEY_ROUTING_METADATA, routes_by_key
from capstan.controller.replica_manager import GroupView, ReplicaManager
from capstan.security.peers import dial_for_client, passed_on_behalf

ROUTE_TIMEOUT_S = 3.0


def route_candidates(view: GroupView) -> list[str]:
    """A group's replicas to ask, the master first, then the other live ones."""
    master = view.master_address
    others = [r.address for r in view.replicas if r.alive and r.address and r.address != master]
    return ([master] if master else []) + others


@answer_unimplemented(
    "the Capstan controller", "call it on a broker (QueryRoute here names a topic's brokers)"
)
class RouteFront(svc_grpc.MessagingServiceServicer):  # type: ignore[misc]
    def __init__(self, manager: ReplicaManager) -> None:
        self._manager = manager
        self._channels = ChannelPool(dial_for_client)

    def _stub(self, address: str) -> svc_grpc.MessagingServiceStub:
        return svc_grpc.MessagingServiceStub(self._channels.get(address))

    async def close(self) -> None:
        await self._channels.close()

    async def QueryRoute(self, request: svc.QueryRouteRequest, context: Any) -> Any:
        views = await asyncio.to_thread(self._views)
        metadata = passed_on_behalf(context)
        routes = await asyncio.gather(*(self._group_route(v, request, metadata) for _, v in views))
        answers = [r[0] if r is not None else None for r in routes]
        queues = [
            q for a in answers if a is not None and a.status.code == pb.OK for q in a.message_queues
        ]
        if queues:
            if any(r is not None and r[1] for r in routes):
                context.set_trailing_metadata(((KEY_ROUTING_METADATA, BY_KEYS),))
            return svc.QueryRouteResponse(
                status=pb.Status(code=pb.OK, message="OK"), message_queues=queues
            )
        refusals = [a.status for a in answers if a is not None]
        silent = [name for (name, _), a in zip(views, answers, strict=True) if a is None]
        known = [r for r in refusals if r.code != pb.TOPIC_NOT_FOUND]
        if known or (refusals and not silent):
            # Every group that answered refused: the first reason other than "not found"
            # (a client drops a route it is told does not exist), or "not found" when
            # every group said so.
            return svc.QueryRouteResponse(status=(known or refusals)[0])
        if refusals:  # no group that answered has it, but one that did not may
            return svc.QueryRouteResponse(
                status=pb.Status(
                    code=pb.INTERNAL_SERVER_ERROR,
                    message=f"no group that answered has topic {request.topic.name!r}; "
                    f"not reached: {', '.join(silent)}",
                )
            )
        return svc.QueryRouteResponse(
            status=pb.Status(
                code=pb.INTERNAL_SERVER_ERROR,
                message="no broker group answered: none is registered or alive",
            )
        )

    def _views(self) -> list[tuple[str, GroupView]]:
        return [(g, self._manager.view(g)) for g in self._manager.group_names()]

    async def _group_route(
        self, view: GroupView, request: svc.QueryRouteRequest, metadata: list[Any]
    ) -> tuple[svc.QueryRouteResponse, bool] | None:
        """The group's answer, and whether it says the topic routes by key. The caller's
        metadata goes along: a broker with authentication on checks its signature."""
        for address in route_candidates(view):
            try:
                call = self._stub(address).QueryRoute(
                    request, timeout=ROUTE_TIMEOUT_S, metadata=metadata
                )
                reply: svc.QueryRouteResponse = await call
                by_key = routes_by_key(list(await call.trailing_metadata() or ()))
            except grpc.aio.AioRpcError:
                continue
            return reply, by_key
        return None

    async def Heartbeat(self, request: svc.HeartbeatRequest, context: Any) -> Any:
        return svc.HeartbeatResponse(status=pb.Status(code=pb.OK, message="OK"))

    async def NotifyClientTermination(
        self, request: svc.NotifyClientTerminationRequest, context: Any
    ) -> Any:
        return svc.NotifyClientTerminationResponse(status=pb.Status(code=pb.OK, message="OK"))
