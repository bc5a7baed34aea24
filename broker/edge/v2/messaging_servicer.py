"""`apache.rocketmq.v2.MessagingService`: each RPC gathers its inputs and hands them to a
handler; unary answers always end with gRPC OK and carry the outcome in `status`."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.broker.broker import Broker
from capstan.broker.edge.v2 import validation
from capstan.broker.edge.v2.clients import ClientRegistry
from capstan.broker.edge.v2.codes import RequestError, ok, put_status, status
from capstan.broker.edge.v2.consume import ConsumeHandler
from capstan.broker.edge.v2.pull import PullHandler
from capstan.broker.edge.v2.route import (
    assignments,
    endpoints_for,
    group_endpoints,
    route_queues,
)
from capstan.broker.edge.v2.send import SendHandler
from capstan.broker.edge.v2.telemetry import TelemetryHandler
from capstan.broker.timer import recall_handle
from capstan.broker.timer.timer_service import NotWaiting
from capstan.broker.transaction.transaction_service import TransactionError

log = logging.getLogger(__name__)

R = TypeVar("R")


def client_id_of(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return str(value)
    return ""


def _local_host(context: grpc.aio.ServicerContext) -> str | None:
    """The host the client dialled, from the :authority it sent."""
    for key, value in context.invocation_metadata() or ():
        if key == ":authority":
            return str(value).rsplit(":", 1)[0]
    return None


class MessagingServicer(svc_grpc.MessagingServiceServicer):  # type: ignore[misc]
    def __init__(self, broker: Broker, clients: ClientRegistry, port: int) -> None:
        self._broker = broker
        self._clients = clients
        self._port = port
        self._send = SendHandler(broker)
        self._consume = ConsumeHandler(broker)
        self._pull = PullHandler(broker)
        self._telemetry = TelemetryHandler(broker, clients)

    async def _timed(self, name: str, call: Callable[[], Awaitable[R]]) -> R:
        started = time.perf_counter()
        response = await call()
        code = getattr(getattr(response, "status", None), "code", 0)
        self._broker.metrics.observe_rpc(name, code, time.perf_counter() - started)
        return response

    def _endpoints(self, request_endpoints: pb.Endpoints, context: Any) -> pb.Endpoints:
        replicas = self._broker.group_addresses()
        if replicas:  # under a controller: every replica; any of them serves the client
            return group_endpoints(replicas)
        host = self._broker.settings.advertised_host or _local_host(context) or "127.0.0.1"
        return endpoints_for(request_endpoints, host, self._port)

    # -- routing -----------------------------------------------------------------------

    async def QueryRoute(self, request: svc.QueryRouteRequest, context: Any) -> Any:
        async def run() -> svc.QueryRouteResponse:
            try:
                topic = validation.existing_topic(self._broker, request.topic, create=True)
            except RequestError as exc:
                return svc.QueryRouteResponse(status=exc.status())
            queues = route_queues(
                topic,
                self._broker.settings.broker_name,
                self._endpoints(request.endpoints, context),
                request.topic.resource_namespace,
                self._broker.group_writable(),
            )
            return svc.QueryRouteResponse(status=ok(), message_queues=queues)

        return await self._timed("QueryRoute", run)

    async def QueryAssignment(self, request: svc.QueryAssignmentRequest, context: Any) -> Any:
        async def run() -> svc.QueryAssignmentResponse:
            try:
                validation.topic_name(request.topic)  # both names before either lookup
                validation.group_name(request.group)
                group = validation.existing_group(self._broker, request.group)
                topic = validation.existing_topic(self._broker, request.topic)
            except RequestError as exc:
                return svc.QueryAssignmentResponse(status=exc.status())
            found = assignments(
                topic,
                self._broker.settings.broker_name,
                self._endpoints(request.endpoints, context),
                group.consume_message_orderly,
                request.topic.resource_namespace,
            )
            if not found:
                return svc.QueryAssignmentResponse(
                    status=status(pb.FORBIDDEN, f"topic {topic.name!r} has no readable queue")
                )
            return svc.QueryAssignmentResponse(status=ok(), assignments=found)

        return await self._timed("QueryAssignment", run)

    # -- clients -----------------------------------------------------------------------

    async def Heartbeat(self, request: svc.HeartbeatRequest, context: Any) -> Any:
        cid = client_id_of(context)
        if not cid:
            return svc.HeartbeatResponse(
                status=status(pb.CLIENT_ID_REQUIRED, "x-mq-client-id metadata is required")
            )
        self._clients.heartbeat(cid, request.client_type, request.group.name)
        return svc.HeartbeatResponse(status=ok())

    async def NotifyClientTermination(
        self, request: svc.NotifyClientTerminationRequest, context: Any
    ) -> Any:
        cid = client_id_of(context)
        if cid:
            self._clients.remove(cid)
        return svc.NotifyClientTerminationResponse(status=ok())

    def Telemetry(
        self, request_iterator: AsyncIterator[svc.TelemetryCommand], context: Any
    ) -> AsyncIterator[svc.TelemetryCommand]:
        return self._telemetry.stream(request_iterator, context, client_id_of(context))

    # -- producing ---------------------------------------------------------------------

    async def SendMessage(self, request: svc.SendMessageRequest, context: Any) -> Any:
        return await self._timed("SendMessage", lambda: self._send.send(request, context))

    async def EndTransaction(self, request: svc.EndTransactionRequest, context: Any) -> Any:
        async def run() -> svc.EndTransactionResponse:
            try:
                topic = validation.topic_name(request.topic)
                if not request.transaction_id.strip():
                    raise RequestError(pb.INVALID_TRANSACTION_ID, "transaction_id is blank")
                if request.resolution == pb.TRANSACTION_RESOLUTION_UNSPECIFIED:
                    # "Unknown": keep the half message; the broker will check back.
                    self._broker.transactions.check_known(
                        topic, request.message_id, request.transaction_id
                    )
                    return svc.EndTransactionResponse(status=ok("left for check-back"))
                decision = await self._broker.transactions.end(
                    topic,
                    request.message_id,
                    request.transaction_id,
                    commit=request.resolution == pb.COMMIT,
                )
            except RequestError as exc:
                return svc.EndTransactionResponse(status=exc.status())
            except TransactionError as exc:
                return svc.EndTransactionResponse(
                    status=status(pb.INVALID_TRANSACTION_ID, str(exc))
                )
            note = "already decided" if decision.already_decided else "OK"
            return svc.EndTransactionResponse(status=ok(note))

        return await self._timed("EndTransaction", run)

    async def RecallMessage(self, request: svc.RecallMessageRequest, context: Any) -> Any:
        async def run() -> svc.RecallMessageResponse:
            try:
                topic = validation.existing_topic(self._broker, request.topic)
            except RequestError as exc:
                return svc.RecallMessageResponse(status=exc.status())
            handle = recall_handle.decode(self._broker.handles, topic.name, request.recall_handle)
            if handle is None:
                return svc.RecallMessageResponse(
                    status=status(
                        pb.BAD_REQUEST,
                        f"not a recall handle this broker issued for topic {topic.name!r}",
                    )
                )
            try:
                result = await self._broker.timer.recall(handle.timer_offset)
            except NotWaiting as exc:
                return svc.RecallMessageResponse(
                    status=status(pb.MESSAGE_NOT_FOUND, str(exc)), message_id=handle.message_id
                )
            return svc.RecallMessageResponse(
                status=put_status(result), message_id=handle.message_id
            )

        return await self._timed("RecallMessage", run)

    # -- consuming ---------------------------------------------------------------------

    async def ReceiveMessage(self, request: svc.ReceiveMessageRequest, context: Any) -> Any:
        started = time.perf_counter()
        async for response in self._consume.receive(request, context):
            yield response
        self._broker.metrics.observe_rpc("ReceiveMessage", 0, time.perf_counter() - started)

    async def AckMessage(self, request: svc.AckMessageRequest, context: Any) -> Any:
        return await self._timed("AckMessage", lambda: self._consume.ack(request))

    async def ChangeInvisibleDuration(
        self, request: svc.ChangeInvisibleDurationRequest, context: Any
    ) -> Any:
        return await self._timed(
            "ChangeInvisibleDuration", lambda: self._consume.change_invisible(request)
        )

    async def ForwardMessageToDeadLetterQueue(
        self, request: svc.ForwardMessageToDeadLetterQueueRequest, context: Any
    ) -> Any:
        return await self._timed(
            "ForwardMessageToDeadLetterQueue", lambda: self._consume.forward_to_dlq(request)
        )

    # -- pull API (Capstan's SDK) ------------------------------------------------------

    async def PullMessage(self, request: svc.PullMessageRequest, context: Any) -> Any:
        async for response in self._pull.pull(request, context):
            yield response

    async def UpdateOffset(self, request: svc.UpdateOffsetRequest, context: Any) -> Any:
        return await self._timed("UpdateOffset", lambda: self._pull.update_offset(request))

    async def GetOffset(self, request: svc.GetOffsetRequest, context: Any) -> Any:
        return await self._timed("GetOffset", lambda: self._pull.get_offset(request))

    async def QueryOffset(self, request: svc.QueryOffsetRequest, context: Any) -> Any:
        return await self._timed("QueryOffset", lambda: self._pull.query_offset(request))
