"""SendMessage: validate a batch, pick queues, and store it as its message type asks.

A batch is checked as a whole first, so a bad message fails the request and nothing of it
is stored. Normal and FIFO messages go straight to the store, delayed ones to the timer,
transactional ones become half messages. A message group always maps to the same queue
(CRC32 of the group modulo the write queues), so one group stays in order.
"""

from __future__ import annotations

import itertools
import zlib
from dataclasses import dataclass

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.broker import Broker
from capstan.broker.grpc_v2 import validation
from capstan.broker.grpc_v2.codes import RequestError, combined, put_code, status
from capstan.broker.grpc_v2.route import accepted_types
from capstan.broker.grpc_v2.wire import (
    PROPERTY_BORN_HOST_NAME,
    PROPERTY_CHECK_AFTER_MS,
    born_host,
    store_properties,
    timestamp_ms,
)
from capstan.broker.store.message import Message
from capstan.broker.store.status import PutResult
from capstan.broker.store.topic_config import TopicConfig
from capstan.common.clock import now_ms

_MAX_RECOVERY_MS = 3_600_000


@dataclass(slots=True)
class _Item:
    index: int
    wire: pb.Message
    message: Message
    kind: int  # pb.NORMAL / FIFO / DELAY / TRANSACTION
    deliver_at_ms: int = 0


class SendHandler:
    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._round_robin: dict[str, itertools.count[int]] = {}

    async def send(self, request: svc.SendMessageRequest) -> svc.SendMessageResponse:
        try:
            topic, items = self._check(request)
        except RequestError as exc:
            entries = [
                svc.SendResultEntry(status=exc.status(), message_id=m.system_properties.message_id)
                for m in request.messages
            ] or [svc.SendResultEntry(status=exc.status())]
            return svc.SendMessageResponse(status=exc.status(), entries=entries)
        entries = await self._store(topic, items)
        code = combined([e.status.code for e in entries])
        top = entries[0].status if code == entries[0].status.code else status(code, "see entries")
        return svc.SendMessageResponse(status=top, entries=entries)

    # -- checking ----------------------------------------------------------------------

    def _check(self, request: svc.SendMessageRequest) -> tuple[TopicConfig, list[_Item]]:
        if not request.messages:
            raise RequestError(pb.BAD_REQUEST, "no messages to send")
        names = {m.topic.name for m in request.messages}
        if len(names) != 1:
            raise RequestError(pb.BAD_REQUEST, "all messages of one request must share a topic")
        topic = validation.existing_topic(self._broker, request.messages[0].topic, create=True)
        if not topic.writable:
            raise RequestError(pb.FORBIDDEN, f"topic {topic.name!r} is not writable")
        now = now_ms()
        items = [self._check_one(i, m, topic, now) for i, m in enumerate(request.messages)]
        return topic, items

    def _check_one(self, index: int, m: pb.Message, topic: TopicConfig, now: int) -> _Item:
        sp = m.system_properties
        limit = self._broker.settings.max_message_body_bytes
        if not sp.message_id:
            raise RequestError(pb.ILLEGAL_MESSAGE_ID, "message_id is required")
        if not m.body:
            raise RequestError(pb.MESSAGE_BODY_EMPTY, "message body is empty")
        if len(m.body) > limit:
            raise RequestError(
                pb.MESSAGE_BODY_TOO_LARGE, f"body of {len(m.body)} bytes; the limit is {limit}"
            )
        if sp.HasField("tag"):
            validation.check_tag(sp.tag)
        validation.check_keys(list(sp.keys))
        validation.check_user_properties(dict(m.user_properties))
        kind = self._kind(sp, topic)
        props = store_properties(m)
        deliver_at = 0
        if kind == pb.DELAY:
            deliver_at = timestamp_ms(sp.delivery_timestamp)
            max_delay = self._broker.settings.timer.max_delay_ms
            if deliver_at > now + max_delay:
                raise RequestError(
                    pb.ILLEGAL_DELIVERY_TIME,
                    f"delivery time is more than {max_delay} ms in the future",
                )
            if deliver_at < 0:
                raise RequestError(pb.ILLEGAL_DELIVERY_TIME, "delivery time is negative")
        if kind == pb.TRANSACTION and sp.HasField("orphaned_transaction_recovery_duration"):
            wait = sp.orphaned_transaction_recovery_duration.ToMilliseconds()
            props[PROPERTY_CHECK_AFTER_MS] = str(min(max(wait, 0), _MAX_RECOVERY_MS))
        host, host_name = born_host(sp.born_host)
        if host_name is not None:
            props[PROPERTY_BORN_HOST_NAME] = host_name
        message = Message(
            topic=topic.name,
            queue_id=self._queue_for(topic, sp),
            body=m.body,
            properties=props,
            born_timestamp_ms=timestamp_ms(sp.born_timestamp)
            if sp.HasField("born_timestamp")
            else now,
            born_host=host,
        )
        return _Item(index, m, message, kind, deliver_at)

    @staticmethod
    def _kind(sp: pb.SystemProperties, topic: TopicConfig) -> int:
        """The message's type, checked against its properties and the topic."""
        declared = sp.message_type
        if declared == pb.MESSAGE_TYPE_UNSPECIFIED:
            declared = (
                pb.FIFO
                if sp.HasField("message_group")
                else pb.DELAY
                if sp.HasField("delivery_timestamp")
                else pb.NORMAL
            )
        if sp.HasField("message_group"):
            validation.check_message_group(sp.message_group)
        conflicts = {
            pb.NORMAL: sp.HasField("message_group") or sp.HasField("delivery_timestamp"),
            pb.FIFO: not sp.HasField("message_group") or sp.HasField("delivery_timestamp"),
            pb.DELAY: not sp.HasField("delivery_timestamp") or sp.HasField("message_group"),
            pb.TRANSACTION: sp.HasField("delivery_timestamp") or sp.HasField("message_group"),
        }
        if declared not in conflicts:
            raise RequestError(
                pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"message type {pb.MessageType.Name(declared)} is not supported",
            )
        if conflicts[declared]:
            raise RequestError(
                pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"a {pb.MessageType.Name(declared)} message may not carry those properties "
                "(FIFO needs a message group, DELAY a delivery timestamp)",
            )
        if declared not in accepted_types(topic):
            raise RequestError(
                pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                f"topic {topic.name!r} is {topic.message_type.value}; it does not accept "
                f"{pb.MessageType.Name(declared)} messages",
            )
        return declared

    def _queue_for(self, topic: TopicConfig, sp: pb.SystemProperties) -> int:
        n = topic.write_queue_nums
        if sp.HasField("message_group"):
            return zlib.crc32(sp.message_group.encode()) % n
        counter = self._round_robin.get(topic.name)
        if counter is None:
            counter = self._round_robin[topic.name] = itertools.count()
        return next(counter) % n

    # -- storing -----------------------------------------------------------------------

    async def _store(self, topic: TopicConfig, items: list[_Item]) -> list[svc.SendResultEntry]:
        entries: list[svc.SendResultEntry | None] = [None] * len(items)
        now = now_ms()
        plain = [i for i in items if i.kind in (pb.NORMAL, pb.FIFO)]
        due_now = [i for i in items if i.kind == pb.DELAY and i.deliver_at_ms <= now]
        delayed = [i for i in items if i.kind == pb.DELAY and i.deliver_at_ms > now]
        txn = [i for i in items if i.kind == pb.TRANSACTION]
        if plain or due_now:
            batch = plain + due_now
            result = await self._broker.put([i.message for i in batch])
            self._answer(entries, batch, result)
        if delayed:
            result = await self._broker.timer.schedule(
                [i.message for i in delayed], [i.deliver_at_ms for i in delayed]
            )
            self._answer(entries, delayed, result)
        if txn:
            result, ids = await self._broker.transactions.prepare([i.message for i in txn])
            self._answer(entries, txn, result, ids)
        return [e for e in entries if e is not None]

    @staticmethod
    def _answer(
        entries: list[svc.SendResultEntry | None],
        items: list[_Item],
        result: PutResult,
        tx_ids: list[str] | None = None,
    ) -> None:
        code = put_code(result.status)
        message = "OK" if result.status.ok else (result.detail or result.status.name)
        for n, item in enumerate(items):
            entry = svc.SendResultEntry(
                status=status(code, message),
                message_id=item.wire.system_properties.message_id,
            )
            if result.status.ok and n < len(result.appended):
                entry.offset = result.appended[n].queue_offset
                if tx_ids is not None:
                    entry.transaction_id = tx_ids[n]
            entries[item.index] = entry
