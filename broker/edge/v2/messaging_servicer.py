"""`apache.rocketmq.v2.MessagingService`: a table from each RPC to the handler method that
serves it, and the one shape every RPC has.

A handler method takes the request and the call's context. It first gathers and checks
what it needs (names, configs, limits), raising a RequestError for anything it refuses,
then applies the change, then replies. The table turns a refusal into the RPC's answer:
unary answers always end with gRPC OK and carry the outcome in `status`; a stream refused
before its first answer gets one answer with the status. Timing and counting every call
is the server's (edge/rpc_metrics.py), not the handlers'.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.broker.edge.v2.codes import RequestError, status
from capstan.broker.edge.v2.consume import ConsumeHandler, change_invisible_refused
from capstan.broker.edge.v2.pull import PullHandler
from capstan.broker.edge.v2.recall import RecallHandler
from capstan.broker.edge.v2.route import RouteHandler
from capstan.broker.edge.v2.send import SendHandler, send_refused
from capstan.broker.edge.v2.telemetry import SessionHandler
from capstan.broker.edge.v2.transaction import TransactionHandler
from capstan.common.disk_full import disk_full_detail, is_disk_full

Refused = Callable[[Any, pb.Status], Any]
"""Builds the answer to a refused request from the request and the refusal's status."""


def _status_only(response_type: Callable[..., Any]) -> Refused:
    def refused(request: Any, refusal: pb.Status) -> Any:
        return response_type(status=refusal)

    return refused


def _unary(handler: str, method: str, refused: Refused) -> Any:
    """An RPC served by `self.<handler>.<method>(request, context)`."""

    async def rpc(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        serve: Callable[[Any, Any], Awaitable[Any]] = getattr(getattr(self, handler), method)
        try:
            return await serve(request, context)
        except RequestError as exc:
            return refused(request, exc.status())
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            return refused(request, _disk_full(exc))

    return rpc


def _stream(handler: str, method: str, response_type: Callable[..., Any]) -> Any:
    """A server-streaming RPC served by the async generator `self.<handler>.<method>`."""

    async def rpc(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        serve: Callable[[Any, Any], AsyncIterator[Any]] = getattr(getattr(self, handler), method)
        try:
            async for response in serve(request, context):
                yield response
        except RequestError as exc:
            yield response_type(status=exc.status())
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            yield response_type(status=_disk_full(exc))

    return rpc


def _disk_full(exc: OSError) -> pb.Status:
    """A state file (the pop journal, offsets, configs) found the disk full; answered as a
    full store's write is (codes.py)."""
    return status(pb.INTERNAL_SERVER_ERROR, disk_full_detail("this call's changes", exc))


class MessagingServicer(svc_grpc.MessagingServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        routes: RouteHandler,
        sessions: SessionHandler,
        send: SendHandler,
        transactions: TransactionHandler,
        recall: RecallHandler,
        consume: ConsumeHandler,
        pull: PullHandler,
    ) -> None:
        self._routes = routes
        self._sessions = sessions
        self._send = send
        self._transactions = transactions
        self._recall = recall
        self._consume = consume
        self._pull = pull

    # -- routing -----------------------------------------------------------------------
    QueryRoute = _unary("_routes", "query_route", _status_only(svc.QueryRouteResponse))
    QueryAssignment = _unary(
        "_routes", "query_assignment", _status_only(svc.QueryAssignmentResponse)
    )

    # -- clients -----------------------------------------------------------------------
    Heartbeat = _unary("_sessions", "heartbeat", _status_only(svc.HeartbeatResponse))
    NotifyClientTermination = _unary(
        "_sessions", "terminate", _status_only(svc.NotifyClientTerminationResponse)
    )

    def Telemetry(
        self, request_iterator: AsyncIterator[svc.TelemetryCommand], context: Any
    ) -> AsyncIterator[svc.TelemetryCommand]:
        return self._sessions.stream(request_iterator, context)

    # -- producing ---------------------------------------------------------------------
    SendMessage = _unary("_send", "send", send_refused)
    EndTransaction = _unary("_transactions", "end", _status_only(svc.EndTransactionResponse))
    RecallMessage = _unary("_recall", "recall", _status_only(svc.RecallMessageResponse))

    # -- consuming ---------------------------------------------------------------------
    ReceiveMessage = _stream("_consume", "receive", svc.ReceiveMessageResponse)
    AckMessage = _unary("_consume", "ack", _status_only(svc.AckMessageResponse))
    ChangeInvisibleDuration = _unary("_consume", "change_invisible", change_invisible_refused)
    ForwardMessageToDeadLetterQueue = _unary(
        "_consume", "forward_to_dlq", _status_only(svc.ForwardMessageToDeadLetterQueueResponse)
    )

    # -- pull API (Capstan's SDK) ------------------------------------------------------
    PullMessage = _stream("_pull", "pull", svc.PullMessageResponse)
    UpdateOffset = _unary("_pull", "update_offset", _status_only(svc.UpdateOffsetResponse))
    GetOffset = _unary("_pull", "get_offset", _status_only(svc.GetOffsetResponse))
    QueryOffset = _unary("_pull", "query_offset", _status_only(svc.QueryOffsetResponse))
