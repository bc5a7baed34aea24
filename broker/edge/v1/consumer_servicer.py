"""capstan.v1.Consumer: membership, queue locks, offsets and send-back for the SDK."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc

from capstan.broker.catalog import Catalog
from capstan.broker.client_offsets import ClientOffsets
from capstan.broker.consumer_groups.membership import (
    GroupMembership,
    Member,
    inconsistency,
    normalize,
)
from capstan.broker.consumer_groups.queue_locks import QueueLocks
from capstan.broker.consumer_groups.send_back import plan_send_back
from capstan.broker.edge.forwarding import older_items_for
from capstan.broker.edge.v1.older_reads import OlderReads
from capstan.broker.metrics import BrokerMetrics
from capstan.broker.pop.pop_service import Put
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.record import CorruptRecord
from capstan.broker.store.subscription_groups import SubscriptionGroupConfig
from capstan.broker.store.topic_config import TopicConfig
from capstan.broker.tag_expression import parse_tag_expression
from capstan.broker.timer.timer_service import TimerService
from capstan.common.clock import now_ms
from capstan.common.grpc_abort import abort, require
from capstan.v1 import consumer_pb2 as pb
from capstan.v1 import consumer_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

MAX_CLIENT_ID_CHARS = 255
WATCH_KEEPALIVE_S = 30.0
"""A watch stream re-sends the member list this often even without a change."""

NOT_FOUND = grpc.StatusCode.NOT_FOUND
INVALID = grpc.StatusCode.INVALID_ARGUMENT


class ConsumerServicer(pb_grpc.ConsumerServicer):
    def __init__(
        self,
        catalog: Catalog,
        store: MessageStore,
        offsets: ClientOffsets,
        members: GroupMembership,
        queue_locks: QueueLocks,
        forget_consumer: Callable[[str, str, str], None],
        put_dead_letter: Put,
        timer: TimerService,
        metrics: BrokerMetrics,
        stopping: Callable[[], bool],
        older: OlderReads,
    ) -> None:
        """`store` holds the messages sent back, `offsets` the group's offsets in the
        clients' terms; `forget_consumer(group,
        client_id, why)` drops a member and its queue locks; `stopping()` says the broker
        is stopping, so watch streams end without dropping their members; `older` reaches
        the groups that keep older items of static topics' logic queues led here."""
        self._catalog = catalog
        self._store = store
        self._offsets = offsets
        self._members = members
        self._queue_locks = queue_locks
        self._forget_consumer = forget_consumer
        self._put_dead_letter = put_dead_letter
        self._timer = timer
        self._metrics = metrics
        self._stopping = stopping
        self._older = older
        self._watch_streams: dict[tuple[str, str], int] = {}
        self._reported: dict[str, str] = {}  # group -> the inconsistency last logged

    # -- checks ------------------------------------------------------------------------

    async def _group(self, context: Any, name: str) -> SubscriptionGroupConfig:
        await require(context, group=name)
        config = self._catalog.group(name)
        if config is None:
            await abort(context, NOT_FOUND, f"consumer group {name!r} not found")
        return config

    async def _client_id(self, context: Any, client_id: str) -> str:
        if not client_id or len(client_id) > MAX_CLIENT_ID_CHARS or not client_id.isprintable():
            await abort(context, INVALID, "client_id must be 1..255 printable characters")
        return client_id

    async def _topic(self, context: Any, name: str) -> TopicConfig:
        await require(context, topic=name)
        topic = self._catalog.topic(name)
        if topic is None:
            await abort(context, NOT_FOUND, f"topic {name!r} not found")
        return topic

    async def _queue(self, context: Any, topic_name: str, queue_id: int) -> TopicConfig:
        topic = await self._topic(context, topic_name)
        if not 0 <= queue_id < max(topic.read_queue_nums, topic.write_queue_nums):
            await abort(context, NOT_FOUND, f"topic {topic.name!r} has no queue {queue_id}")
        return topic

    async def _queues(self, context: Any, refs: Iterable[pb.QueueRef]) -> list[tuple[str, int]]:
        keys = []
        for ref in refs:
            await self._queue(context, ref.topic, ref.queue_id)
            keys.append((ref.topic, ref.queue_id))
        return keys

    # -- membership --------------------------------------------------------------------

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatReply:
        client_id = await self._client_id(context, request.client_id)
        config = await self._group(context, request.group)
        if not config.consume_enable:
            await abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"group {config.group_name!r} may not consume",
            )
        if request.message_model == pb.BROADCASTING and not config.consume_broadcast_enable:
            await abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"group {config.group_name!r} may not consume by broadcasting",
            )
        for sub in request.subscriptions:
            # A topic this group does not hold is no error (as RocketMQ's brokers take it): a
            # consumer of several topics beats every group, and each holds some of them.
            await require(context, topic=sub.topic)
            try:
                parse_tag_expression(sub.expression)
            except ValueError as exc:
                await abort(context, INVALID, f"subscription to {sub.topic!r}: {exc}")
        member = Member(
            client_id=client_id,
            message_model=request.message_model or pb.CLUSTERING,
            consume_type=request.consume_type or pb.PUSH,
            orderly=request.orderly,
            subscriptions=normalize((s.topic, s.expression) for s in request.subscriptions),
            owned=tuple(sorted((q.topic, q.broker_name, q.queue_id) for q in request.owned)),
        )
        changed, version = self._members.heartbeat(config.group_name, member)
        if changed:
            log.info("consumer %s joined or changed in group %s", client_id, config.group_name)
            self._check_subscriptions(config.group_name)
        return pb.HeartbeatReply(members_version=version)

    def _check_subscriptions(self, group: str) -> None:
        problem = inconsistency(self._members.members(group))
        if problem and self._reported.get(group) != problem:
            log.warning("consumer group %s subscribes inconsistently: %s", group, problem)
            self._metrics.subscription_conflicts.labels(group).inc()
        self._reported[group] = problem

    def _members_message(self, group: str) -> pb.GroupMembers:
        return members_report(self._members, group)

    async def WatchGroup(
        self, request: pb.WatchGroupRequest, context: Any
    ) -> AsyncIterator[pb.GroupMembers]:
        client_id = await self._client_id(context, request.client_id)
        config = await self._group(context, request.group)
        group = config.group_name
        key = (group, client_id)
        self._watch_streams[key] = self._watch_streams.get(key, 0) + 1
        members = self._members
        # Resets before the stream opened are in the committed offsets the client reads.
        seen_reset = members.last_reset_id(group)
        try:
            while not self._stopping():
                reply = self._members_message(group)
                reset_id, offsets = members.resets_since(group, seen_reset)
                seen_reset = reset_id
                if offsets:
                    reply.offset_reset.reset_id = reset_id
                    reply.offset_reset.offsets.extend(
                        pb.QueueOffset(topic=t, queue_id=q, offset=o) for t, q, o in offsets
                    )
                yield reply
                await members.wait_change(group, reply.members_version, WATCH_KEEPALIVE_S)
        finally:
            self._watch_streams[key] -= 1
            if not self._watch_streams[key]:
                del self._watch_streams[key]
                if not self._stopping() and members.remove(group, client_id):
                    log.info("consumer %s left group %s (its watch stream ended)", client_id, group)

    async def Unregister(self, request: pb.UnregisterRequest, context: Any) -> pb.UnregisterReply:
        client_id = await self._client_id(context, request.client_id)
        config = await self._group(context, request.group)
        self._forget_consumer(config.group_name, client_id, "it unregistered")
        return pb.UnregisterReply()

    async def GetMembers(self, request: pb.GetMembersRequest, context: Any) -> pb.GroupMembers:
        config = await self._group(context, request.group)
        return self._members_message(config.group_name)

    # -- queue locks -------------------------------------------------------------------

    async def LockQueues(self, request: pb.LockQueuesRequest, context: Any) -> pb.LockQueuesReply:
        client_id = await self._client_id(context, request.client_id)
        config = await self._group(context, request.group)
        keys = await self._queues(context, request.queues)
        held = self._queue_locks.lock(config.group_name, client_id, keys)
        return pb.LockQueuesReply(
            locked=[pb.QueueRef(topic=t, queue_id=q) for t, q in held],
            expiry_ms=round(self._queue_locks.expiry_s * 1000),
        )

    async def UnlockQueues(
        self, request: pb.UnlockQueuesRequest, context: Any
    ) -> pb.UnlockQueuesReply:
        client_id = await self._client_id(context, request.client_id)
        config = await self._group(context, request.group)
        keys = await self._queues(context, request.queues)
        self._queue_locks.unlock(config.group_name, client_id, keys)
        return pb.UnlockQueuesReply()

    # -- offsets -----------------------------------------------------------------------

    async def CommitOffsets(
        self, request: pb.CommitOffsetsRequest, context: Any
    ) -> pb.CommitOffsetsReply:
        config = await self._group(context, request.group)
        checked = []
        for entry in request.offsets:
            await self._queue(context, entry.topic, entry.queue_id)
            bounds = self._offsets.bounds(entry.topic, entry.queue_id)
            if not 0 <= entry.offset <= bounds[1]:
                await abort(
                    context,
                    INVALID,
                    f"offset {entry.offset} of {entry.topic}:{entry.queue_id} is outside "
                    f"0..{bounds[1]}",
                )
            checked.append(entry)
        offsets = self._offsets
        elsewhere: dict[str, list[pb.QueueOffset]] = {}
        for entry in checked:
            older = offsets.older_item(entry.topic, entry.queue_id, entry.offset)
            if older is not None:  # an offset in an older item: its group keeps it
                elsewhere.setdefault(older.group, []).append(entry)
                continue
            offsets.commit(config.group_name, entry.topic, entry.queue_id, entry.offset)
        for group, entries in elsewhere.items():
            passed = pb.CommitOffsetsRequest(group=request.group, offsets=entries)
            await self._older.commit(group, passed, context)
        return pb.CommitOffsetsReply()

    async def QueryOffset(self, request: pb.QueryOffsetRequest, context: Any) -> Any:
        config = await self._group(context, request.group)
        await self._queue(context, request.topic, request.queue_id)
        name, topic, queue = config.group_name, request.topic, request.queue_id
        if older_items_for(context) is not None:  # the leading group asks: commits only
            found = self._offsets.committed(name, topic, queue)
        else:
            found = self._offsets.start_for(name, topic, queue)
            older = self._offsets.older_groups(topic, queue)
            if found is None and older:
                found = await self._older.committed(older, request, context)
        return pb.QueryOffsetReply(found=found is not None, offset=found or 0)

    async def SearchOffset(self, request: pb.SearchOffsetRequest, context: Any) -> Any:
        await self._queue(context, request.topic, request.queue_id)
        offset = self._offsets.for_time(request.topic, request.queue_id, request.timestamp_ms)
        return pb.SearchOffsetReply(offset=offset or 0)

    async def GetQueueBounds(self, request: pb.GetQueueBoundsRequest, context: Any) -> Any:
        await self._queue(context, request.topic, request.queue_id)
        if older_items_for(context) is not None:  # another group asks what is here
            low, high = self._offsets.bounds(request.topic, request.queue_id)
        else:
            low, high = self._offsets.read_bounds(request.topic, request.queue_id)
        return pb.GetQueueBoundsReply(min_offset=low, max_offset=high)

    # -- retry -------------------------------------------------------------------------

    async def SendBack(self, request: pb.SendBackRequest, context: Any) -> pb.SendBackReply:
        config = await self._group(context, request.group)
        if request.max_reconsume_times < 0:
            await abort(context, INVALID, "max_reconsume_times may not be negative")
        try:
            failed = self._store.read_message(request.commit_log_offset)
        except CorruptRecord:
            failed = None
        if failed is None or failed.phys_offset != request.commit_log_offset:
            await abort(
                context, NOT_FOUND, f"no message is stored at offset {request.commit_log_offset}"
            )
        limit = request.max_reconsume_times or config.retry_max_times
        plan = plan_send_back(failed, config.group_name, request.delay_level, limit, now_ms())
        self._catalog.topic(plan.message.topic)  # creates %RETRY% / %DLQ% on first use
        if plan.dead_letter:
            result = await self._put_dead_letter([plan.message])
        else:
            result = await self._timer.schedule([plan.message], [plan.deliver_at_ms])
        if not result.status.ok:
            await abort(
                context,
                grpc.StatusCode.UNAVAILABLE,
                f"store refused the copy: {result.status.name}",
            )
        self._metrics.send_backs.labels(config.group_name).inc()
        return pb.SendBackReply(
            topic=plan.message.topic,
            reconsume_times=plan.message.reconsume_times,
            deliver_at_ms=plan.deliver_at_ms,
        )


def members_report(membership: GroupMembership, group: str) -> pb.GroupMembers:
    """A group's members as the Consumer and Admin services show them."""
    now = time.monotonic()
    members = membership.members(group)
    problem = inconsistency(members)
    return pb.GroupMembers(
        group=group,
        members_version=membership.version(group),
        members=[
            pb.Member(
                client_id=m.client_id,
                message_model=m.message_model,  # type: ignore[arg-type]
                consume_type=m.consume_type,  # type: ignore[arg-type]
                orderly=m.orderly,
                subscriptions=[pb.Subscription(topic=t, expression=e) for t, e in m.subscriptions],
                seconds_since_heartbeat=round(now - m.last_heartbeat, 3),
                owned=[pb.QueueRef(topic=t, broker_name=b, queue_id=q) for t, b, q in m.owned],
            )
            for m in members
        ],
        subscriptions_consistent=not problem,
        inconsistency=problem,
    )
