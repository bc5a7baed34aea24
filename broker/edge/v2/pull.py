"""The offset-based pull API for Capstan's own SDK, on the v2 RPCs PullMessage,
UpdateOffset, GetOffset and QueryOffset (the official clients only carry stubs for them).

PullMessage streams a status, the messages, then `next_offset`. When the offset is at the
queue's end it suspends (up to 15 s by default) and answers the moment a message arrives.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.catalog import Catalog
from capstan.broker.client_offsets import ClientOffsets
from capstan.broker.edge.v2 import validation
from capstan.broker.edge.v2.codes import RequestError, ok, status
from capstan.broker.edge.v2.wire import fill_wire, timestamp_ms
from capstan.broker.long_polling import suspend_s
from capstan.broker.metrics import BrokerMetrics
from capstan.broker.queue_reads import QueueReader
from capstan.broker.store.status import GetResult, GetStatus
from capstan.broker.store.topic_config import TopicConfig

_MAX_PULL_BATCH = 256


class PullHandler:
    def __init__(
        self,
        catalog: Catalog,
        reader: QueueReader,
        offsets: ClientOffsets,
        metrics: BrokerMetrics,
        max_wait_ms: int,
        store_host: str,
    ) -> None:
        """`offsets` answers committed offsets and queue bounds; `max_wait_ms` caps a
        pull's wait."""
        self._catalog = catalog
        self._reader = reader
        self._offsets = offsets
        self._metrics = metrics
        self._max_wait_ms = max_wait_ms
        self._store_host = store_host

    def _queue(self, queue: pb.MessageQueue) -> tuple[TopicConfig, int]:
        topic = validation.existing_topic(self._catalog, queue.topic)
        if not 0 <= queue.id < max(topic.read_queue_nums, topic.write_queue_nums):
            raise RequestError(pb.BAD_REQUEST, f"topic {topic.name!r} has no queue {queue.id}")
        return topic, queue.id

    def _group(self, group: pb.Resource) -> str:
        return validation.existing_group(self._catalog, group).group_name

    async def pull(
        self, request: svc.PullMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[svc.PullMessageResponse]:
        group = self._group(request.group)
        topic, qid = self._queue(request.message_queue)
        tags = validation.tag_filter(request.filter_expression)
        if request.batch_size <= 0:
            raise RequestError(pb.BAD_REQUEST, "batch_size must be positive")
        wait_s = self._wait_s(request, context)
        batch = min(request.batch_size, _MAX_PULL_BATCH)
        result = await self._reader.pull(
            topic.name, qid, request.offset, batch, tags, wait_s, group=group
        )
        for response in self._answer(result, topic.name):
            yield response

    def _wait_s(self, request: svc.PullMessageRequest, context: grpc.aio.ServicerContext) -> float:
        limit_ms = self._max_wait_ms
        wait_ms = (
            request.long_polling_timeout.ToMilliseconds()
            if request.HasField("long_polling_timeout")
            else limit_ms
        )
        return suspend_s(wait_ms, limit_ms, context.time_remaining())

    def _answer(self, result: GetResult, topic: str) -> list[svc.PullMessageResponse]:
        s = result.status
        if s in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
            head = status(
                pb.ILLEGAL_OFFSET, f"{s.name}: queue holds {result.min_offset}..{result.max_offset}"
            )
        elif s is GetStatus.NO_MATCHED_LOGIC_QUEUE:
            head = status(pb.NOT_FOUND, "no such queue")
        elif result.messages:
            head = ok()
        else:
            head = status(pb.MESSAGE_NOT_FOUND, s.name)
        out = [svc.PullMessageResponse(status=head)]
        host = self._store_host
        size = 0
        for m in result.messages:
            size += len(m.body)
            response = svc.PullMessageResponse()
            fill_wire(response.message, m, host, topic=topic)
            out.append(response)
        if result.messages:
            self._metrics.count_out(topic, len(result.messages), size)
        out.append(svc.PullMessageResponse(next_offset=result.next_begin_offset))
        return out

    async def update_offset(
        self, request: svc.UpdateOffsetRequest, context: grpc.aio.ServicerContext
    ) -> svc.UpdateOffsetResponse:
        group = self._group(request.group)
        topic, qid = self._queue(request.message_queue)
        _, high = self._offsets.bounds(topic.name, qid)
        if not 0 <= request.offset <= high:
            raise RequestError(
                pb.ILLEGAL_OFFSET, f"offset {request.offset} is beyond the queue end {high}"
            )
        self._offsets.commit(group, topic.name, qid, request.offset)
        return svc.UpdateOffsetResponse(status=ok())

    async def get_offset(
        self, request: svc.GetOffsetRequest, context: grpc.aio.ServicerContext
    ) -> svc.GetOffsetResponse:
        group = self._group(request.group)
        topic, qid = self._queue(request.message_queue)
        offset = self._offsets.committed(group, topic.name, qid)
        if offset is None:
            return svc.GetOffsetResponse(
                status=status(pb.OFFSET_NOT_FOUND, "the group has committed no offset here")
            )
        return svc.GetOffsetResponse(status=ok(), offset=offset)

    async def query_offset(
        self, request: svc.QueryOffsetRequest, context: grpc.aio.ServicerContext
    ) -> svc.QueryOffsetResponse:
        topic, qid = self._queue(request.message_queue)
        offsets = self._offsets
        low, high = offsets.bounds(topic.name, qid)
        policy = request.query_offset_policy
        if policy == pb.BEGINNING:
            offset = low
        elif policy == pb.END:
            offset = high
        else:
            found = offsets.for_time(topic.name, qid, timestamp_ms(request.timestamp))
            offset = high if found is None else found
        return svc.QueryOffsetResponse(status=ok(), offset=offset)
