"""RecallMessage: take back a delayed message before it is delivered, by the recall
handle its send answered with."""

from __future__ import annotations

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.catalog import Catalog
from capstan.broker.edge.v2 import validation
from capstan.broker.edge.v2.codes import RequestError, put_status, status
from capstan.broker.pop.receipt_handle import HandleCodec
from capstan.broker.timer import recall_handle
from capstan.broker.timer.timer_service import NotWaiting, TimerService


class RecallHandler:
    def __init__(self, catalog: Catalog, timer: TimerService, handles: HandleCodec) -> None:
        """`handles` checks the recall handles this broker signed."""
        self._catalog = catalog
        self._timer = timer
        self._handles = handles

    async def recall(
        self, request: svc.RecallMessageRequest, context: grpc.aio.ServicerContext
    ) -> svc.RecallMessageResponse:
        topic = validation.existing_topic(self._catalog, request.topic)
        handle = recall_handle.decode(self._handles, topic.name, request.recall_handle)
        if handle is None:
            raise RequestError(
                pb.BAD_REQUEST, f"not a recall handle this broker issued for topic {topic.name!r}"
            )
        try:
            result = await self._timer.recall(handle.timer_offset)
        except NotWaiting as exc:
            return svc.RecallMessageResponse(
                status=status(pb.MESSAGE_NOT_FOUND, str(exc)), message_id=handle.message_id
            )
        return svc.RecallMessageResponse(status=put_status(result), message_id=handle.message_id)
