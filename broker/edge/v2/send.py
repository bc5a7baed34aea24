"""SendMessage: validate a batch, pick queues, and store it as its message type asks.

A batch is checked as a whole first, so a bad message fails the request and nothing of it
is stored: here what the v2 protocol asks of a message (id, tag, keys, properties, type),
then once by the store's admission what any stored message must be (body size, topic
writable, queue id; store/admission.py), whatever its type. Normal and FIFO messages go
straight to the store, delayed ones to the timer, transactional ones become half messages.
A message group always maps to the same queue (CRC32 of the group modulo the write
queues), so one group stays in order; so does a keyed message of a compact topic (CRC32 of
its keys, capstan/common/key_routing.py), so compaction finds every record of a key in one
queue.

Capstan's SDK picks the queue itself and names it in `x-capstan-queue-id`; the broker then
stores every message of the request there. A successful answer names each message's queue
in the trailing `x-capstan-queue-ids`, which official clients simply ignore.

A send to a static topic's logic queue that is moving (sealed on its old group, not yet
open on the new one) is held here until the move is done, for up to `MOVE_HOLD_S` (less
when the client's deadline is nearer), and then stored here or passed on to the group that
leads the queue now: a client never sees the seal, which normally lasts well under a
second. A move that takes longer (a group not answering mid-move) is answered
REQUEST_TIMEOUT, which the official clients and the SDK retry (the official Python client
ends at once on TOO_MANY_REQUESTS, so that code would not do).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import zlib
from dataclasses import dataclass

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.catalog import Catalog
from capstan.broker.edge.v2 import validation
from capstan.broker.edge.v2.codes import RequestError, put_code, put_status, status
from capstan.broker.edge.v2.group_pass_on import GroupPassOn, PassOn
from capstan.broker.edge.v2.route import accepted_types
from capstan.broker.edge.v2.wire import born_host, timestamp_ms
from capstan.broker.pop.receipt_handle import HandleCodec
from capstan.broker.static_placement import still_led
from capstan.broker.static_topics import StaticTopics, StaticView
from capstan.broker.store.admission import AdmittedBatch
from capstan.broker.store.compaction import is_compact
from capstan.broker.store.message import SYSFLAG_COMPRESSED, Message
from capstan.broker.store.properties import (
    KEY_SEPARATOR,
    PROPERTY_BORN_HOST_NAME,
    PROPERTY_CHECK_AFTER_MS,
    PROPERTY_DELIVER_TIME_MS,
    PROPERTY_KEYS,
    PROPERTY_MESSAGE_GROUP,
    PROPERTY_TAGS,
    PROPERTY_TRACE_CONTEXT,
    PROPERTY_UNIQ_KEY,
)
from capstan.broker.store.status import PutResult
from capstan.broker.store.topic_config import TopicConfig
from capstan.broker.timer import recall_handle
from capstan.broker.timer.timer_service import TimerService
from capstan.broker.transaction.transaction_service import TransactionService
from capstan.broker.write_path import WritePath
from capstan.common.clock import now_ms
from capstan.common.key_routing import queue_index

_MAX_RECOVERY_MS = 3_600_000

QUEUE_ID_METADATA = "x-capstan-queue-id"
"""Request metadata from Capstan's SDK: the queue id every message of the request goes to."""

STORED_QUEUES_METADATA = "x-capstan-queue-ids"
"""Trailing metadata of a successful send: each message's queue id, comma-separated in
request order."""

_QUEUE_ID_MAX_DIGITS = 9

MOVE_HOLD_S = 2.0
"""Longest a send waits for a static topic's logic queue to finish moving, in seconds."""
MOVE_POLL_S = 0.05
"""How often a held send looks whether the move is done, in seconds."""
DEADLINE_MARGIN_S = 0.3
"""A held send is answered this long before the client's deadline, in seconds."""


class QueueMoving(Exception):
    """The send names a static topic's logic queue that is moving between groups."""


class _Batch:
    """What every message of one request is checked against."""

    __slots__ = (
        "accepts_normal",
        "by_key",
        "elsewhere",
        "now",
        "queue_id",
        "spread_queue",
        "static",
        "topic",
    )

    def __init__(
        self, topic: TopicConfig, now: int, queue_id: int | None, static: StaticView | None
    ) -> None:
        self.topic = topic
        self.static = static
        """A static topic's view here: its queue ids are logic queues, and only the ones
        this group leads take writes here."""
        self.elsewhere: dict[str, int] = {}
        """Per group that leads the logic queue of some of the messages, how many."""
        self.now = now
        self.queue_id = queue_id
        """The queue the sender named for the whole request, or None to pick per message."""
        self.accepts_normal = pb.NORMAL in accepted_types(topic)
        self.by_key = is_compact(topic)
        """Whether a keyed message goes to its key's queue (a compact topic)."""
        self.spread_queue: int | None = None
        """The queue of this request's messages that no group or key places: one for the
        request (as RocketMQ's proxy picks), the next one round robin for the next request,
        so a batch is stored as one batch record."""


@dataclass(slots=True)
class _Item:
    index: int
    wire: pb.Message
    message: Message
    kind: int  # pb.NORMAL / FIFO / DELAY / TRANSACTION
    deliver_at_ms: int = 0


class SendHandler:
    def __init__(
        self,
        catalog: Catalog,
        writes: WritePath,
        timer: TimerService,
        transactions: TransactionService,
        handles: HandleCodec,
        body_limit: int,
        max_delay_ms: int,
        static: StaticTopics,
        pass_on: GroupPassOn,
    ) -> None:
        """`handles` signs recall handles; `body_limit` is the largest body accepted, in
        bytes; `max_delay_ms` how far ahead a delivery time may lie."""
        self._static = static
        self._pass_on = pass_on
        self._catalog = catalog
        self._writes = writes
        self._timer = timer
        self._transactions = transactions
        self._handles = handles
        self._body_limit = body_limit
        self._max_delay_ms = max_delay_ms
        self._round_robin: dict[str, itertools.count[int]] = {}

    async def send(
        self, request: svc.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> svc.SendMessageResponse:
        named = _named_queue(context)
        try:
            try:
                topic, static, items = self._check(request, named)
            except QueueMoving:  # rare: no coroutine on the common path
                topic, static, items = await self._check_held(request, named, context)
        except PassOn as elsewhere:  # a static topic's queue another group leads
            reply: svc.SendMessageResponse = await self._pass_on.send(
                elsewhere.group, request, context
            )
            return reply
        admitted = self._writes.admit([i.message for i in items], self._body_limit)
        if isinstance(admitted, PutResult):
            raise RequestError(put_code(admitted.status), admitted.detail)
        outcomes = await self._store(topic, items, admitted, static is not None)
        codes = {o[0].code for o in outcomes}
        top = outcomes[0][0] if len(codes) == 1 else status(pb.MULTIPLE_RESULTS, "see entries")
        if top.code == pb.OK:
            stored = ",".join([str(item.message.queue_id) for item in items])
            context.set_trailing_metadata(((STORED_QUEUES_METADATA, stored),))
        if static is not None:
            outcomes = _logic_offsets(static, items, outcomes)
        response = svc.SendMessageResponse(status=top)
        add = response.entries.add
        for item, (st, offset, handle) in zip(items, outcomes, strict=True):
            message_id = item.wire.system_properties.message_id
            if not handle:
                if offset >= 0:
                    add(status=st, message_id=message_id, offset=offset)
                else:
                    add(status=st, message_id=message_id)
            elif item.kind == pb.TRANSACTION:
                add(status=st, message_id=message_id, offset=offset, transaction_id=handle)
            else:
                add(status=st, message_id=message_id, offset=offset, recall_handle=handle)
        return response

    # -- checking ----------------------------------------------------------------------

    async def _check_held(
        self, request: svc.SendMessageRequest, named: str | None, context: grpc.aio.ServicerContext
    ) -> tuple[TopicConfig, StaticView | None, list[_Item]]:
        """`_check` again while a logic queue the send names is moving (module docstring)."""
        hold = MOVE_HOLD_S
        remaining = context.time_remaining()
        if remaining is not None:
            hold = min(hold, remaining - DEADLINE_MARGIN_S)
        until = time.monotonic() + hold
        while True:
            try:
                return self._check(request, named)
            except QueueMoving as moving:
                if time.monotonic() >= until:
                    raise RequestError(pb.REQUEST_TIMEOUT, str(moving)) from None
            await asyncio.sleep(MOVE_POLL_S)

    def _check(
        self, request: svc.SendMessageRequest, named: str | None
    ) -> tuple[TopicConfig, StaticView | None, list[_Item]]:
        messages = request.messages
        if not messages:
            raise RequestError(pb.BAD_REQUEST, "no messages to send")
        first = messages[0].topic
        name = first.name
        if any(m.topic.name != name for m in messages):
            raise RequestError(pb.BAD_REQUEST, "all messages of one request must share a topic")
        topic = validation.existing_topic(self._catalog, first, create=True)
        static = self._static.view(topic.name)
        queue_id = None if named is None else _queue_of(named, topic)
        batch = _Batch(topic, now_ms(), queue_id, static)
        check_one = self._check_one
        items = [check_one(i, m, batch) for i, m in enumerate(messages)]
        if batch.elsewhere:
            _pass_on_or_refuse(batch, items)
        return topic, static, items

    def _check_one(self, index: int, m: pb.Message, batch: _Batch) -> _Item:
        """One message of a batch. Every message of every send goes through here, so each
        field is read once and the common case (a NORMAL message without tag, keys or
        properties) takes no detours."""
        sp = m.system_properties
        has = sp.HasField
        body = m.body
        message_id = sp.message_id
        if not message_id:
            raise RequestError(pb.ILLEGAL_MESSAGE_ID, "message_id is required")
        user = m.user_properties
        props: dict[str, str] = {}
        if user:
            props.update(user)
            validation.check_user_properties(props)
        props[PROPERTY_UNIQ_KEY] = message_id
        if has("tag"):
            tag = sp.tag
            validation.check_tag(tag)
            props[PROPERTY_TAGS] = tag
        stored_keys = ""
        if sp.keys:
            keys = list(sp.keys)
            validation.check_keys(keys)
            stored_keys = props[PROPERTY_KEYS] = KEY_SEPARATOR.join(keys)
        has_group = has("message_group")
        has_delivery = has("delivery_timestamp")
        kind = sp.message_type
        if has_group or has_delivery or kind != pb.NORMAL or not batch.accepts_normal:
            kind = _kind(kind, has_group, has_delivery, batch.topic)
        if has_group:
            group = sp.message_group
            validation.check_message_group(group)
            props[PROPERTY_MESSAGE_GROUP] = group
        if has("trace_context"):
            props[PROPERTY_TRACE_CONTEXT] = sp.trace_context
        deliver_at = 0
        if has_delivery:
            deliver_at = timestamp_ms(sp.delivery_timestamp)
            props[PROPERTY_DELIVER_TIME_MS] = str(deliver_at)
            if kind == pb.DELAY:
                self._check_delivery_time(deliver_at, batch.now)
        elif kind == pb.TRANSACTION and has("orphaned_transaction_recovery_duration"):
            wait = sp.orphaned_transaction_recovery_duration.ToMilliseconds()
            props[PROPERTY_CHECK_AFTER_MS] = str(min(max(wait, 0), _MAX_RECOVERY_MS))
        host, host_name = born_host(sp.born_host)
        if host_name is not None:
            props[PROPERTY_BORN_HOST_NAME] = host_name
        queue_id = batch.queue_id
        if queue_id is None:
            if has_group:
                queue_id = zlib.crc32(sp.message_group.encode()) % batch.topic.write_queue_nums
            elif stored_keys and batch.by_key:
                queue_id = queue_index(stored_keys, batch.topic.write_queue_nums)
            else:
                queue_id = batch.spread_queue
                if queue_id is None:
                    queue_id = batch.spread_queue = self._next_queue(batch.topic, batch.static)
        if batch.static is not None:  # a named, grouped or keyed queue another group leads
            leader = _check_led(batch.static, queue_id)
            if leader is not None:
                batch.elsewhere[leader] = batch.elsewhere.get(leader, 0) + 1
        born = timestamp_ms(sp.born_timestamp) if has("born_timestamp") else batch.now
        encoding = sp.body_encoding
        sys_flag = 0 if encoding == pb.IDENTITY else _sys_flag(encoding)
        message = Message(batch.topic.name, queue_id, body, props, 0, sys_flag, born, host)
        return _Item(index, m, message, kind, deliver_at)

    def _check_delivery_time(self, deliver_at: int, now: int) -> None:
        max_delay = self._max_delay_ms
        if deliver_at > now + max_delay:
            raise RequestError(
                pb.ILLEGAL_DELIVERY_TIME, f"delivery time is more than {max_delay} ms in the future"
            )
        if deliver_at < 0:
            raise RequestError(pb.ILLEGAL_DELIVERY_TIME, "delivery time is negative")

    def _next_queue(self, topic: TopicConfig, static: StaticView | None) -> int:
        counter = self._round_robin.get(topic.name)
        if counter is None:
            counter = self._round_robin[topic.name] = itertools.count()
        if static is None:
            return next(counter) % topic.write_queue_nums
        if not static.led_order:
            raise RequestError(
                pb.FORBIDDEN,
                f"group {static.group!r} takes no writes of static topic {topic.name!r}: "
                "send to the groups its route names",
            )
        return static.led_order[next(counter) % len(static.led_order)]

    # -- storing -----------------------------------------------------------------------

    def _recall_handles(
        self, topic: TopicConfig, items: list[_Item], parked: PutResult
    ) -> list[str]:
        """A recall handle for each delayed message the timer took."""
        codec = self._handles
        return [
            recall_handle.encode(
                codec,
                topic.name,
                recall_handle.RecallHandle(
                    a.queue_offset, item.deliver_at_ms, item.wire.system_properties.message_id
                ),
            )
            for item, a in zip(items, parked.appended, strict=False)
        ]

    async def _store(
        self, topic: TopicConfig, items: list[_Item], admitted: AdmittedBatch, static: bool
    ) -> list[_Outcome]:
        """Store the admitted batch; each item's outcome, in request order. Delayed and
        transactional messages are stored wrapped (timer, half messages), as the
        services that own them decide."""
        outcomes: list[_Outcome | None] = [None] * len(items)
        refusal = self._writes.write_refusal()
        if refusal is not None:  # before the timer or the transactions see them
            _record(outcomes, items, refusal)
            return [o for o in outcomes if o is not None]
        now = now_ms()
        plain = [i for i in items if i.kind in (pb.NORMAL, pb.FIFO)]
        due_now = [i for i in items if i.kind == pb.DELAY and i.deliver_at_ms <= now]
        delayed = [i for i in items if i.kind == pb.DELAY and i.deliver_at_ms > now]
        txn = [i for i in items if i.kind == pb.TRANSACTION]
        if plain or due_now:
            batch = plain + due_now
            gate = (
                still_led(self._static, {(topic.name, i.message.queue_id) for i in batch})
                if static
                else None
            )
            result = await self._writes.put_admitted(admitted.pick([i.index for i in batch]), gate)
            _record(outcomes, batch, result)
        if delayed:
            result = await self._timer.schedule(
                [i.message for i in delayed], [i.deliver_at_ms for i in delayed]
            )
            _record(outcomes, delayed, result, self._recall_handles(topic, delayed, result))
        if txn:
            result, ids = await self._transactions.prepare([i.message for i in txn])
            _record(outcomes, txn, result, ids)
        return [o for o in outcomes if o is not None]


def _check_led(static: StaticView, queue_id: int) -> str | None:
    """None when this group leads logic queue `queue_id`; the group that does when another
    one leads it; QueueMoving while it is moving; refused when the topic lacks it."""
    if queue_id in static.led:
        return None
    topic = static.mapping.topic
    if not 0 <= queue_id < static.mapping.total_queues:
        raise RequestError(
            pb.BAD_REQUEST,
            f"static topic {topic!r} has no logic queue {queue_id} "
            f"(0..{static.mapping.total_queues - 1})",
        )
    leader = static.mapping.leader(queue_id)
    if leader.is_pending:
        raise QueueMoving(
            f"logic queue {queue_id} of static topic {topic!r} is moving to group "
            f"{leader.group!r}; retry shortly"
        )
    return leader.group


def _pass_on_or_refuse(batch: _Batch, items: list[_Item]) -> None:
    """Every message of the request for one other group: pass the request on to it. Some
    here and some there, or for several groups: refused, as nothing of it may be stored
    unless all of it is. A transactional message is never passed on: its producer ends
    the transaction where it sent it, and the group that stored it would never hear."""
    groups = sorted(batch.elsewhere)
    topic = batch.topic.name
    if any(i.kind == pb.TRANSACTION for i in items):
        raise RequestError(
            pb.FORBIDDEN,
            f"the logic queue of static topic {topic!r} this transactional message "
            f"belongs to takes its writes on group {groups[0]!r}: send it there (its route "
            "names it)",
        )
    if len(groups) == 1 and batch.elsewhere[groups[0]] == len(items):
        raise PassOn(groups[0])
    raise RequestError(
        pb.BAD_REQUEST,
        f"the messages of this request belong to logic queues of static topic {topic!r} "
        f"that different groups lead ({', '.join(groups)} and maybe this one); send them "
        "in separate requests",
    )


def _logic_offsets(
    static: StaticView, items: list[_Item], outcomes: list[_Outcome]
) -> list[_Outcome]:
    """Outcomes with the offset of each message stored in the topic's own queues (no
    handle: not parked by the timer, not a half message) as the logic offset clients see."""
    logic = static.logic_offset
    return [
        (st, logic(item.message.queue_id, offset), h) if offset >= 0 and not h else (st, offset, h)
        for item, (st, offset, h) in zip(items, outcomes, strict=True)
    ]


def send_refused(request: svc.SendMessageRequest, refusal: pb.Status) -> svc.SendMessageResponse:
    """A refused request: nothing of it was stored, and every message says why."""
    response = svc.SendMessageResponse(status=refusal)
    add = response.entries.add
    for m in request.messages:
        add(status=refusal, message_id=m.system_properties.message_id)
    if not request.messages:
        add(status=refusal)
    return response


def _sys_flag(encoding: int) -> int:
    """The store's flag for a body encoding: a GZIP body is kept as sent and marked
    compressed, so consumers are told to inflate it."""
    if encoding == pb.IDENTITY or encoding == pb.ENCODING_UNSPECIFIED:
        return 0
    if encoding == pb.GZIP:
        return SYSFLAG_COMPRESSED
    raise RequestError(pb.BAD_REQUEST, f"body_encoding {encoding} is not supported")


def _named_queue(context: grpc.aio.ServicerContext) -> str | None:
    """The raw `x-capstan-queue-id` of the request, if it has one."""
    for key, value in context.invocation_metadata() or ():
        if key == QUEUE_ID_METADATA:
            return str(value)
    return None


def _queue_of(named: str, topic: TopicConfig) -> int:
    """The queue id a sender named; whether the topic has it is the store's admission."""
    # The length bound keeps int() away from huge digit strings, which it refuses.
    if named.isascii() and named.isdigit() and len(named) <= _QUEUE_ID_MAX_DIGITS:
        return int(named)
    raise RequestError(
        pb.BAD_REQUEST,
        f"{QUEUE_ID_METADATA} {named[: _QUEUE_ID_MAX_DIGITS + 1]!r} is not a queue id of "
        f"topic {topic.name!r} (0..{topic.write_queue_nums - 1})",
    )


_Outcome = tuple[pb.Status, int, str]
"""A message's status, queue offset (-1 when not stored) and handle: its transaction id
(TRANSACTION) or recall handle (DELAY, parked in the timer), else ""."""


def _record(
    outcomes: list[_Outcome | None],
    items: list[_Item],
    result: PutResult,
    handles: list[str] | None = None,
) -> None:
    """Note each item's outcome at its place in the request."""
    shared = put_status(result)
    appended = result.appended if result.status.ok else []
    for n, item in enumerate(items):
        if n < len(appended):
            handle = handles[n] if handles is not None else ""
            outcomes[item.index] = (shared, appended[n].queue_offset, handle)
        else:
            outcomes[item.index] = (shared, -1, "")


def _kind(declared: int, has_group: bool, has_delivery: bool, topic: TopicConfig) -> int:
    """The message's type, checked against its properties and the topic."""
    if declared == pb.MESSAGE_TYPE_UNSPECIFIED:
        declared = pb.FIFO if has_group else pb.DELAY if has_delivery else pb.NORMAL
    if declared == pb.NORMAL or declared == pb.TRANSACTION:
        conflict = has_group or has_delivery
    elif declared == pb.FIFO:
        conflict = not has_group or has_delivery
    elif declared == pb.DELAY:
        conflict = not has_delivery or has_group
    else:
        raise RequestError(
            pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"message type {pb.MessageType.Name(declared)} is not supported",
        )
    if conflict:
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
