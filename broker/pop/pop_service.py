"""Receive, ack, change-invisible and dead-lettering for the official clients.

A receive hands out messages and makes them invisible to the group for a while; each copy
gets a receipt handle. An ack with the current handle finishes the message. If the
invisible time runs out first, the next receive hands the message out again with
`delivery_attempt + 1`; once a message has been delivered `max_attempts` times and comes
due again, it goes to `%DLQ%<group>` instead.

A receive is served from any queue of the topic, whichever the client named (see
`queue_choice`). FIFO groups: a queue with any message in flight hands out nothing new (a
receive passes it by and serves other queues), and a message that comes due again is
handed out before anything after it, so a message group (which always maps to one queue)
is consumed in order. On a static topic's logic queue that moved here from another group,
a FIFO group is held at the new item's start until it finished the old one there
(OrderGate, broker/static_topics.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Container
from dataclasses import dataclass

from capstan.broker.pop.pop_state import PopState, QueueKey, QueuePop
from capstan.broker.pop.queue_choice import next_start, queue_order, redeliverable_at
from capstan.broker.pop.receipt_handle import HandleCodec, ReceiptHandle
from capstan.broker.relocation import copy_message
from capstan.broker.static_topics import OrderGate
from capstan.broker.store.message import Message, StoredMessage
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.properties import (
    PROPERTY_DLQ_ORIGIN_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_UNIQ_KEY,
)
from capstan.broker.store.status import GetStatus, PutResult, PutStatus
from capstan.broker.store.subscription_groups import SubscriptionGroupConfig
from capstan.broker.store.topic_config import TopicConfig
from capstan.broker.system_topics import dlq_topic
from capstan.common.clock import now_ms

log = logging.getLogger(__name__)

Put = Callable[[list[Message]], Awaitable[PutResult]]


def max_attempts(group: SubscriptionGroupConfig) -> int:
    """Deliveries a message gets before it is dead-lettered (RocketMQ: retries + 1)."""
    return group.retry_max_times + 1


class HandleError(Exception):
    """A receipt handle that is forged, malformed, or no longer current."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a delivered copy of a message adds to it."""

    receipt_handle: str = ""
    delivery_attempt: int = 1
    invisible_ms: int = 0


@dataclass(frozen=True, slots=True)
class Received:
    message: StoredMessage
    delivery: Delivery


class PopService:
    def __init__(
        self,
        store: MessageStore,
        state: PopState,
        codec: HandleCodec,
        gate: OrderGate | None = None,
    ) -> None:
        """`gate` holds FIFO groups at the items of static topics' logic queues that
        continue another group's item (broker/static_topics.py)."""
        self._gate = gate
        self._store = store
        self._state = state
        self._codec = codec
        self._rotation: dict[tuple[str, str], int] = {}
        self._committed: dict[QueueKey, int] = {}  # ack offsets last written as commits

    # -- receive -----------------------------------------------------------------------

    def receive(
        self,
        group: SubscriptionGroupConfig,
        topic: TopicConfig,
        tags: set[str] | None,
        batch: int,
        invisible_ms: int,
        only: Container[int] | None = None,
    ) -> list[Received]:
        """Hand out up to `batch` messages now (no waiting) from any queue of the topic (of
        those in `only`, when given), starting after the queue the group's previous
        receive last took from; journals before returning."""
        rotation = (group.group_name, topic.name)
        count = topic.read_queue_nums
        start = self._rotation.get(rotation, 0)
        out: list[Received] = []
        now = now_ms()
        limit = max_attempts(group)
        last_served = None
        for qid in queue_order(count, start):
            if len(out) >= batch:
                break
            if only is not None and qid not in only:
                continue
            key = (group.group_name, topic.name, qid)
            q = self._queue_state(key)
            got = self._take(key, q, group, tags, batch - len(out), now, invisible_ms, limit)
            if got:
                out.extend(got)
                last_served = qid
        self._rotation[rotation] = next_start(count, start, last_served)
        self._state.write()
        return out

    def in_flight(self, group: str, topic: str, queue_id: int) -> int:
        """How many messages of the queue `group` has received and not yet acknowledged."""
        q = self._state.queues.get((group, topic, queue_id))
        return 0 if q is None else len(q.inflight)

    def _queue_state(self, key: QueueKey) -> QueuePop:
        q = self._state.queues.get(key)
        if q is not None:
            return q
        committed = self._store.consumer_offsets.query(*key)
        bounds = self._store.queue_bounds(key[1], key[2])
        start = committed if committed is not None else (bounds[0] if bounds else 0)
        return self._state.ensure(key, start)

    def _take(
        self,
        key: QueueKey,
        q: QueuePop,
        group: SubscriptionGroupConfig,
        tags: set[str] | None,
        batch: int,
        now: int,
        invisible_ms: int,
        limit: int,
    ) -> list[Received]:
        fifo = group.consume_message_orderly
        due = self._due_offsets(q, now, limit)
        if fifo and len(due) < len(q.inflight):
            return []  # an earlier message of this queue is still being consumed
        out = self._redeliver(key, q, due[:batch], now, invisible_ms)
        q.recompute_due()
        if fifo and q.inflight:
            return out
        stop = None
        if fifo and self._gate is not None:
            stop = self._gate.stop_at(*key)
            if stop is not None and q.next_offset >= stop:
                self._gate.blocked(*key)
                return out
        if len(out) < batch:
            out.extend(self._deliver_new(key, q, tags, batch - len(out), now, invisible_ms, stop))
        return out

    @staticmethod
    def _due_offsets(q: QueuePop, now: int, limit: int) -> list[int]:
        if q.next_due_ms > now:
            return []
        return sorted(
            off for off, e in q.inflight.items() if e.visible_at_ms <= now and e.attempt < limit
        )

    def _redeliver(
        self, key: QueueKey, q: QueuePop, offsets: list[int], now: int, invisible_ms: int
    ) -> list[Received]:
        out = []
        for off in offsets:
            msg = self._read_at(key[1], key[2], off)
            if msg is None:  # removed by retention meanwhile: nothing left to deliver
                self._state.done(key, q, off)
                continue
            attempt = q.inflight[off].attempt + 1
            out.append(self._hand_out(key, q, msg, now, invisible_ms, attempt))
        return out

    def _deliver_new(
        self,
        key: QueueKey,
        q: QueuePop,
        tags: set[str] | None,
        batch: int,
        now: int,
        invisible_ms: int,
        stop: int | None = None,
    ) -> list[Received]:
        """New messages from the queue's next offset, none at or past `stop`."""
        result = self._store.get(key[1], key[2], q.next_offset, batch, tags)
        if result.status in (GetStatus.OFFSET_TOO_SMALL, GetStatus.OFFSET_OVERFLOW_BADLY):
            self._state.advance(key, q, result.next_begin_offset)
            result = self._store.get(key[1], key[2], q.next_offset, batch, tags)
        found = result.messages
        next_offset = result.next_begin_offset
        if stop is not None:
            found = [m for m in found if m.queue_offset < stop]
            next_offset = min(next_offset, stop)
        out = [self._hand_out(key, q, m, now, invisible_ms, 1) for m in found]
        if result.status in (
            GetStatus.FOUND,
            GetStatus.NO_MATCHED_MESSAGE,
            GetStatus.MESSAGE_WAS_REMOVING,
        ):
            self._state.advance(key, q, next_offset)
        return out

    def _hand_out(
        self,
        key: QueueKey,
        q: QueuePop,
        msg: StoredMessage,
        now: int,
        invisible_ms: int,
        attempt: int,
    ) -> Received:
        seq = self._state.issue(key, q, msg.queue_offset, now + invisible_ms, attempt)
        handle = self._codec.encode(key[0], key[1], ReceiptHandle(key[2], msg.queue_offset, seq))
        return Received(msg, Delivery(handle, attempt, invisible_ms))

    def _read_at(self, topic: str, queue_id: int, offset: int) -> StoredMessage | None:
        result = self._store.get(topic, queue_id, offset, 1)
        for m in result.messages:
            if m.queue_offset == offset:
                return m
        return None

    def next_due_ms(self, group: SubscriptionGroupConfig, topic: TopicConfig) -> int | None:
        """When something the group holds in flight on the topic may be handed out again
        (None: nothing will by time alone)."""
        fifo, limit, now = group.consume_message_orderly, max_attempts(group), now_ms()
        due = [
            redeliverable_at(q, fifo, limit, now)
            for qid in range(topic.read_queue_nums)
            if (q := self._state.queues.get((group.group_name, topic.name, qid))) is not None
        ]
        return min((at for at in due if at is not None), default=None)

    # -- ack and friends ---------------------------------------------------------------

    def _lookup(self, group: str, topic: str, text: str) -> tuple[QueueKey, QueuePop, int]:
        handle = self._codec.decode(group, topic, text)
        if handle is None:
            raise HandleError("receipt handle is malformed or was not issued for this group")
        key = (group, topic, handle.queue_id)
        q = self._state.queues.get(key)
        entry = q.inflight.get(handle.offset) if q is not None else None
        if q is None or entry is None or entry.seq != handle.seq:
            raise HandleError(
                "receipt handle has expired: the message was acknowledged, "
                "redelivered or its handle changed"
            )
        return key, q, handle.offset

    def ack(self, group: str, topic: str, handle: str, *, write: bool = True) -> bool:
        """Finish a message; True when its queue has nothing in flight any more (a FIFO
        group's queue can hand out again). With write=False the caller calls
        `write_journal` once after a batch of acks, before answering."""
        key, q, offset = self._lookup(group, topic, handle)
        self._state.done(key, q, offset)
        if write:
            self._state.write()
        return not q.inflight

    def write_journal(self) -> None:
        self._state.write()

    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        """Make the message invisible for `invisible_ms` from now; returns the new handle."""
        key, q, offset = self._lookup(group, topic, handle)
        attempt = q.inflight[offset].attempt
        seq = self._state.issue(key, q, offset, now_ms() + invisible_ms, attempt)
        if invisible_ms == 0:
            q.next_due_ms = 0
        self._state.write()
        return self._codec.encode(group, topic, ReceiptHandle(key[2], offset, seq))

    def give_back(self, group: str, topic: str, received: list[Received]) -> None:
        """Make `received`, handed out by a receive whose answer never reached its client
        (cancelled, past its deadline, failed before it was sent), due again at once, as if
        that delivery had not happened: the next receive gets them with the same delivery
        attempt, rather than after their invisible time. A handle no longer current (acked
        or handed out again meanwhile) is left as it is."""
        now = now_ms()
        for item in received:
            try:
                key, q, offset = self._lookup(group, topic, item.delivery.receipt_handle)
            except HandleError:
                continue
            self._state.issue(key, q, offset, now, q.inflight[offset].attempt - 1)
        self._state.write()

    async def forward_to_dlq(self, group: str, topic: str, handle: str, put: Put) -> PutResult:
        key, q, offset = self._lookup(group, topic, handle)
        attempt = q.inflight[offset].attempt
        return await self._dead_letter(key, offset, attempt, put)

    async def _dead_letter(self, key: QueueKey, offset: int, attempt: int, put: Put) -> PutResult:
        group, topic, qid = key
        msg = self._read_at(topic, qid, offset)
        result = None if msg is None else await put([to_dlq(group, msg, attempt)])
        q = self._state.queues.get(key)
        if (result is None or result.status.ok) and q is not None:
            self._state.done(key, q, offset)
            self._state.write()
        return result or PutResult(PutStatus.PUT_OK, detail="message no longer stored")

    async def revive(
        self, groups: Callable[[str], SubscriptionGroupConfig | None], put: Put
    ) -> set[str]:
        """Dead-letter messages that came due after their last allowed delivery; the
        topics they left, where a FIFO queue they blocked may hand out again."""
        now = now_ms()
        moved: set[str] = set()
        for key, q in list(self._state.queues.items()):
            if q.next_due_ms > now or not q.inflight:
                continue
            config = groups(key[0])
            limit = max_attempts(config) if config is not None else None
            for off, entry in sorted(q.inflight.items()):
                expired = entry.visible_at_ms <= now
                if expired and (limit is None or entry.attempt >= limit):
                    result = await self._dead_letter(key, off, entry.attempt, put)
                    if result.status.ok:
                        moved.add(key[1])
        return moved

    # -- offsets -----------------------------------------------------------------------

    def commit_offsets(self) -> None:
        """Record each queue's ack offset as the group's consumer offset when it moved
        since the last time: a group that also commits by the pull API (or an admin reset)
        keeps those commits until pop consumption moves again."""
        for key, q in self._state.queues.items():
            if self._committed.get(key) != q.ack_offset:
                self._store.consumer_offsets.commit(*key, q.ack_offset)
                self._committed[key] = q.ack_offset

    def reset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """An admin moved the group's offset: pop consumption of the queue, if the group
        has any, starts again from there, and what it had in flight is forgotten. A queue
        the group never popped gets no pop state; it reads the committed offset when it
        first does."""
        key = (group, topic, queue_id)
        if key in self._state.queues:
            self._state.reset(key, offset)
            self._state.write()
            self._committed[key] = offset


def to_dlq(group: str, msg: StoredMessage, attempt: int) -> Message:
    props = dict(msg.properties)
    props[PROPERTY_DLQ_ORIGIN_TOPIC] = msg.topic
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, props.get(PROPERTY_UNIQ_KEY, msg.offset_msg_id))
    return copy_message(msg, dlq_topic(group), 0, props, reconsume_times=attempt)
