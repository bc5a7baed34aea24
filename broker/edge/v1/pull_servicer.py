"""capstan.v1.Pull on the broker: PullMessages returns a batch of one queue in one response.

The statuses are RocketMQ's PullStatus, mapped from the store's GetStatus the way
RocketMQ's pull processor maps them. (The v2 PullMessage, which streams one message per
response, is in `edge/v2/pull.py`; both read through `Broker.pull`.)
"""

from __future__ import annotations

import functools
from typing import Any

import grpc

from capstan.broker.catalog import Catalog
from capstan.broker.edge.v1.older_reads import OlderReads
from capstan.broker.long_polling import suspend_s
from capstan.broker.metrics import BrokerMetrics
from capstan.broker.queue_reads import QueueReader
from capstan.broker.store.message import unpack_host
from capstan.broker.store.message_store import DEFAULT_GET_MAX_BYTES
from capstan.broker.store.properties import PROPERTY_UNIQ_KEY
from capstan.broker.store.status import GetResult, GetStatus
from capstan.broker.tag_expression import parse_tag_expression
from capstan.common.grpc_abort import abort, require
from capstan.v1 import pull_pb2 as pb
from capstan.v1 import pull_pb2_grpc as pb_grpc

MAX_PULL_MESSAGES = 1024

_STATUS = {
    GetStatus.FOUND: pb.FOUND,
    GetStatus.NO_MATCHED_MESSAGE: pb.NO_MATCHED_MSG,
    GetStatus.MESSAGE_WAS_REMOVING: pb.NO_MATCHED_MSG,
    GetStatus.OFFSET_OVERFLOW_ONE: pb.NO_NEW_MSG,
    GetStatus.NO_MESSAGE_IN_QUEUE: pb.NO_NEW_MSG,
    GetStatus.OFFSET_TOO_SMALL: pb.OFFSET_ILLEGAL,
    GetStatus.OFFSET_OVERFLOW_BADLY: pb.OFFSET_ILLEGAL,
}


@functools.lru_cache(maxsize=1024)
def _host_text(raw: bytes) -> str:
    host, port = unpack_host(raw)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class PullServicer(pb_grpc.PullServicer):
    def __init__(
        self,
        catalog: Catalog,
        reader: QueueReader,
        metrics: BrokerMetrics,
        max_wait_ms: int,
        older: OlderReads,
    ) -> None:
        """`max_wait_ms` caps how long a pull waits at the end of a queue; `older` reads a
        static topic's older items on the groups that keep them."""
        self._catalog = catalog
        self._reader = reader
        self._metrics = metrics
        self._max_wait_ms = max_wait_ms
        self._older = older

    async def PullMessages(
        self, request: pb.PullMessagesRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        await require(context, topic=request.topic)
        # No group: a read that belongs to no consumer group (a Spark scan, an audit).
        if request.group and self._catalog.group(request.group) is None:
            await abort(
                context, grpc.StatusCode.NOT_FOUND, f"consumer group {request.group!r} not found"
            )
        topic = self._catalog.topic(request.topic)
        if topic is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"topic {request.topic!r} not found")
        if not 0 <= request.queue_id < max(topic.read_queue_nums, topic.write_queue_nums):
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"topic {topic.name!r} has no queue {request.queue_id}",
            )
        if not 0 < request.max_messages <= MAX_PULL_MESSAGES:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"max_messages must be 1..{MAX_PULL_MESSAGES}, not {request.max_messages}",
            )
        if request.offset < 0 or request.long_polling_ms < 0 or request.max_bytes < 0:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "offset, long_polling_ms and max_bytes may not be negative",
            )
        try:
            tags = parse_tag_expression(request.tag_expression)
        except ValueError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if not topic.readable:
            await abort(
                context, grpc.StatusCode.PERMISSION_DENIED, f"topic {topic.name!r} is not readable"
            )
        offset = request.offset
        older = self._reader.older_item(topic.name, request.queue_id, offset)
        while older is not None:  # an older item of a logic queue led here, on its group
            passed = pb.PullMessagesRequest()
            passed.CopyFrom(request)
            passed.offset = offset
            answer = await self._older.pull(older.group, passed, context)
            end = older.logic_end
            if answer.messages or end is None or answer.next_begin_offset < end:
                answer.continues_on = ""  # the queue goes on here, where the client is
                return answer
            offset = end  # read to its end: on at the next item
            older = self._reader.older_item(topic.name, request.queue_id, offset)
        result = await self._reader.pull(
            topic.name,
            request.queue_id,
            offset,
            request.max_messages,
            tags,
            self._wait_s(request, context),
            request.max_bytes or DEFAULT_GET_MAX_BYTES,
            group=request.group,
            wait_when_held=False,
        )
        response = self._answer(result, topic.name)
        if not result.messages:
            response.continues_on = self._reader.continues_on(
                topic.name, request.queue_id, result.next_begin_offset
            )
            response.commit_wanted = self._reader.held_at(
                request.group, topic.name, request.queue_id, result.next_begin_offset
            )
        return response

    def _wait_s(self, request: pb.PullMessagesRequest, context: grpc.aio.ServicerContext) -> float:
        limit_ms = self._max_wait_ms
        return suspend_s(request.long_polling_ms, limit_ms, context.time_remaining())

    def _answer(self, result: GetResult, topic: str) -> pb.PullMessagesResponse:
        if result.status is GetStatus.NO_MATCHED_LOGIC_QUEUE:  # deleted while we waited
            status = pb.OFFSET_ILLEGAL
        else:
            status = _STATUS[result.status]
        response = pb.PullMessagesResponse(
            status=status,
            next_begin_offset=result.next_begin_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
            unreadable_offsets=result.unreadable_offsets,
        )
        if not result.messages:
            return response
        add = response.messages.add
        size = 0
        for m in result.messages:
            props = m.properties
            body = m.body
            size += len(body)
            add(
                queue_id=m.queue_id,
                queue_offset=m.queue_offset,
                commit_log_offset=m.phys_offset,
                message_id=props.get(PROPERTY_UNIQ_KEY, ""),
                body=body,
                properties=props,
                born_timestamp_ms=m.born_timestamp_ms,
                store_timestamp_ms=m.store_timestamp_ms,
                born_host=_host_text(m.born_host),
                store_host=_host_text(m.store_host),
                reconsume_times=m.reconsume_times,
                sys_flag=m.sys_flag,
                body_crc=m.body_crc,
                flag=m.flag,
            )
        self._metrics.count_out(topic, len(result.messages), size)
        return response
