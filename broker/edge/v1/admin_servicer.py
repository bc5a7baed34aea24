"""capstan.v1.Admin on the broker. Errors are gRPC status codes with a readable detail.

Each RPC has the v2 edge's shape: it checks the request and gathers what it names (a
missing topic or group is NOT_FOUND), has the services decide and apply (group positions,
resets and what is unconsumed are broker/group_offsets.py's), and turns the answer into the
reply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from capstan.broker.consumer_groups.membership import GroupMembership
from capstan.broker.edge.v1.compaction_call import compact_topic
from capstan.broker.edge.v1.consumer_servicer import members_report
from capstan.broker.edge.v1.user_admin import UserAdmin
from capstan.broker.edge.v2.clients import ClientRegistry
from capstan.broker.group_offsets import GroupOffsets, QueuePosition, ResetTarget
from capstan.broker.handed_messages import from_handed
from capstan.broker.static_topics import StaticTopicRefused, StaticTopics
from capstan.broker.store.message import (
    LOCALHOST,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    Message,
    StoredMessage,
)
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.status import PutResult, PutStatus
from capstan.broker.store.subscription_groups import (
    MAX_RETRY_TIMES,
    SubscriptionGroupConfig,
    validate_group_name,
)
from capstan.broker.store.topic_config import (
    DEFAULT_PERM,
    MAX_QUEUE_NUMS,
    MessageType,
    TopicConfig,
    validate_topic_name,
)
from capstan.broker.system_topics import is_group_topic, is_system_topic
from capstan.client.queue_mapping_wire import mapping_from_wire, mapping_to_wire
from capstan.common.errors import ConfigError
from capstan.common.grpc_abort import abort, require
from capstan.common.queue_mapping import MappingError
from capstan.v1 import admin_pb2 as pb
from capstan.v1 import admin_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_TYPES = {
    pb.NORMAL: MessageType.NORMAL,
    pb.FIFO: MessageType.FIFO,
    pb.DELAY: MessageType.DELAY,
    pb.TRANSACTION: MessageType.TRANSACTION,
    pb.MIXED: MessageType.MIXED,
}
_TYPE_NUMBERS = {v: k for k, v in _TYPES.items()}
_MAX_LOOKUP = 64


class AdminServicer(pb_grpc.AdminServicer):
    def __init__(
        self,
        store: MessageStore,
        offsets: GroupOffsets,
        members: GroupMembership,
        clients: ClientRegistry,
        backlog: Callable[[], tuple[int, int]],
        broker_name: str,
        is_master: Callable[[], bool],
        catalog_on_slaves: Callable[[], Awaitable[list[int]]] | None = None,
        hand_over: Callable[[int], Awaitable[tuple[bool, str]]] | None = None,
        static_topics: StaticTopics | None = None,
        take_placed: Callable[[list[Message]], Awaitable[PutResult]] | None = None,
    ) -> None:
        """`members` are the SDK consumers of each group and `clients` the official
        clients' sessions, both listed in a group's status; `offsets` says where groups
        stand and moves them."""
        self._store = store
        self._offsets = offsets
        self._members = members
        self._clients = clients
        self._backlog = backlog
        """(half messages, delayed messages waiting), for DescribeBroker."""
        self._broker_name = broker_name
        self._is_master = is_master
        self._catalog_on_slaves = catalog_on_slaves
        """Waits until the in-sync slaves hold a topic or group change (ids of those that
        do not in time); None for a broker without slaves."""
        self._users = UserAdmin(store.users, self._replicated)
        self._hand_over = hand_over
        """Moves this master's leadership to a member once it holds everything; None for
        a broker without a controller."""
        self._static = static_topics or StaticTopics(
            store.topics, store.queue_mappings, broker_name
        )
        self._take_placed = take_placed
        """Stores messages another group hands on (StaticPlacement.take)."""

    async def _replicated(self, context: Any, what: str) -> None:
        """Answer a change of topics or groups only once the slaves that a failover could
        promote hold it: otherwise a master lost right after could take it with it."""
        if self._catalog_on_slaves is None:
            return
        lagging = await self._catalog_on_slaves()
        if lagging:
            ids = ", ".join(map(str, lagging))
            await abort(
                context,
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{what} is stored on the master, but in-sync slave(s) {ids} did not confirm "
                "it in time: it could be lost if the master failed now; run the command "
                "again to confirm",
            )

    # -- topics ------------------------------------------------------------------------

    async def _topic_config(
        self, request: pb.Topic, context: Any, existing: TopicConfig | None
    ) -> TopicConfig:
        problem = validate_topic_name(request.name)
        if problem is None and (is_system_topic(request.name) or is_group_topic(request.name)):
            problem = f"{request.name!r} is a name the broker reserves for itself"
        if problem is not None:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, problem)
        base = existing or TopicConfig(request.name)
        kind = base.message_type
        if request.type != pb.TOPIC_TYPE_UNSPECIFIED:
            if request.type not in _TYPES:
                await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "unknown topic type")
            kind = _TYPES[request.type]
        read = request.read_queue_nums or base.read_queue_nums
        write = request.write_queue_nums or base.write_queue_nums
        if read < 0 or write < 0 or read > MAX_QUEUE_NUMS or write > MAX_QUEUE_NUMS:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"queue counts must be within 1..{MAX_QUEUE_NUMS}",
            )
        try:
            return TopicConfig(
                name=request.name,
                read_queue_nums=read,
                write_queue_nums=write,
                perm=request.perm or (base.perm if existing else DEFAULT_PERM),
                message_type=kind,
                attributes=dict(request.attributes) or base.attributes,
            )
        except ConfigError as exc:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def _topic_status(self, config: TopicConfig, physical: bool = False) -> pb.TopicStatus:
        """The topic and its queues here; a static topic's queues in the logic offsets
        clients use, unless `physical` (beside its mapping, which names physical ones)."""
        queues = []
        logic = self._static.to_logic
        for qid in range(max(config.read_queue_nums, config.write_queue_nums)):
            low, high = self._store.queue_bounds(config.name, qid) or (0, 0)
            if not physical:
                low, high = logic(config.name, qid, low), logic(config.name, qid, high)
            queues.append(
                pb.QueueStatus(
                    queue_id=qid, min_offset=low, max_offset=high, broker=self._broker_name
                )
            )
        return pb.TopicStatus(
            topic=pb.Topic(
                name=config.name,
                type=_TYPE_NUMBERS[config.message_type],
                read_queue_nums=config.read_queue_nums,
                write_queue_nums=config.write_queue_nums,
                perm=config.perm,
                attributes=config.attributes,
            ),
            queues=queues,
            system=is_system_topic(config.name) or is_group_topic(config.name),
            brokers=[self._broker_name],
        )

    async def CreateTopic(self, request: pb.Topic, context: Any) -> pb.TopicReply:
        config = await self._topic_config(request, context, None)
        if self._store.topics.get(request.name) is not None:
            await abort(
                context, grpc.StatusCode.ALREADY_EXISTS, f"topic {request.name!r} already exists"
            )
        self._store.topics.put(config)
        await self._replicated(context, f"topic {request.name!r}")
        return pb.TopicReply(topic=self._topic_status(config))

    async def UpdateTopic(self, request: pb.Topic, context: Any) -> pb.TopicReply:
        await require(context, name=request.name)
        existing = self._store.topics.get(request.name)
        if existing is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"topic {request.name!r} not found")
        config = await self._topic_config(request, context, existing)
        mapping = self._static.mapping(request.name)
        if mapping is not None and (
            config.read_queue_nums != config.write_queue_nums
            or config.write_queue_nums != self._static.queue_count(mapping)
        ):
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"static topic {request.name!r} has {mapping.total_queues} logic queues; "
                "its queue count cannot change",
            )
        self._store.topics.put(config)
        await self._replicated(context, f"topic {request.name!r}")
        return pb.TopicReply(topic=self._topic_status(config))

    async def DeleteTopic(self, request: pb.TopicRequest, context: Any) -> pb.DeleteReply:
        await require(context, name=request.name)
        if is_system_topic(request.name):
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"{request.name!r} is a system topic"
            )
        if self._store.topics.get(request.name) is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"topic {request.name!r} not found")
        deleted = self._store.delete_topic(request.name)
        self._store.queue_mappings.delete(request.name)  # a static topic's mapping with it
        await self._replicated(context, f"deleting topic {request.name!r}")
        return pb.DeleteReply(deleted=deleted)

    async def DescribeTopic(self, request: pb.TopicRequest, context: Any) -> pb.TopicReply:
        await require(context, name=request.name)
        config = self._store.topics.get(request.name)
        if config is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"topic {request.name!r} not found")
        return pb.TopicReply(topic=self._topic_status(config))

    async def ListTopics(self, request: pb.ListTopicsRequest, context: Any) -> pb.ListTopicsReply:
        out = []
        for config in sorted(self._store.topics.all(), key=lambda t: t.name):
            status = self._topic_status(config)
            if status.system and not request.include_system:
                continue
            out.append(status)
        return pb.ListTopicsReply(topics=out)

    # -- static topics -----------------------------------------------------------------

    async def SetQueueMapping(
        self, request: pb.SetQueueMappingRequest, context: Any
    ) -> pb.QueueMappingReply:
        config = await self._topic_config(request.topic, context, None)
        try:
            mapping = mapping_from_wire(request.mapping)
            held = self._static.adopt(config, mapping)
        except (MappingError, StaticTopicRefused) as exc:
            code = grpc.StatusCode.INVALID_ARGUMENT
            if isinstance(exc, StaticTopicRefused):
                code = grpc.StatusCode.FAILED_PRECONDITION
            await abort(context, code, str(exc))
        await self._replicated(context, f"the queue mapping of static topic {config.name!r}")
        stored = self._store.topics.get(config.name) or config
        return pb.QueueMappingReply(
            mapping=mapping_to_wire(held), topic=self._topic_status(stored, physical=True)
        )

    async def PlaceMessages(
        self, request: pb.PlaceMessagesRequest, context: Any
    ) -> pb.PlaceMessagesReply:
        if self._take_placed is None:
            await abort(context, grpc.StatusCode.UNIMPLEMENTED, "this broker takes no messages")
        messages = []
        for p in request.messages:
            if self._static.view(p.topic) is None:
                await abort(
                    context,
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{p.topic!r} is not a static topic on group {self._broker_name!r}",
                )
            if len(p.born_host) != len(LOCALHOST) or (
                p.sys_flag & SYSFLAG_TRANSACTION_MASK == SYSFLAG_TRANSACTION_PREPARED
            ):
                await abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "a placed message needs a 20-byte born_host and may not be a half message",
                )
            messages.append(from_handed(p))
        result = await self._take_placed(messages)
        if not result.status.ok:
            code = (
                grpc.StatusCode.FAILED_PRECONDITION
                if result.status is PutStatus.NOT_WRITEABLE
                else grpc.StatusCode.UNAVAILABLE
            )
            await abort(context, code, f"{result.status.name}: {result.detail}")
        logic = self._static.to_logic
        log.info("stored %d message(s) handed on by group %r", len(messages), request.from_group)
        return pb.PlaceMessagesReply(
            queue_ids=[m.queue_id for m in messages],
            queue_offsets=[
                logic(m.topic, m.queue_id, a.queue_offset)
                for m, a in zip(messages, result.appended, strict=True)
            ],
        )

    async def GetQueueMapping(
        self, request: pb.QueueMappingRequest, context: Any
    ) -> pb.QueueMappingReply:
        await require(context, topic=request.topic)
        held = self._static.mapping(request.topic)
        config = self._store.topics.get(request.topic)
        if held is None or config is None:
            await abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"no static topic {request.topic!r} on group {self._broker_name!r}",
            )
        return pb.QueueMappingReply(
            mapping=mapping_to_wire(held), topic=self._topic_status(config, physical=True)
        )

    # -- groups ------------------------------------------------------------------------

    async def _group_config(
        self, request: pb.Group, context: Any, existing: SubscriptionGroupConfig | None
    ) -> SubscriptionGroupConfig:
        problem = validate_group_name(request.name)
        if problem is not None:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, problem)
        if request.max_attempts < 0 or request.max_attempts > MAX_RETRY_TIMES + 1:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"max_attempts must be within 1..{MAX_RETRY_TIMES + 1}",
            )
        base = existing or SubscriptionGroupConfig(request.name)
        retries = request.max_attempts - 1 if request.max_attempts else base.retry_max_times
        return SubscriptionGroupConfig(
            group_name=request.name,
            consume_enable=request.consume_enable if existing is None else base.consume_enable,
            retry_max_times=retries,
            consume_message_orderly=request.fifo,
            consume_broadcast_enable=base.consume_broadcast_enable,
            retry_queue_nums=base.retry_queue_nums,
            attributes=base.attributes,
        )

    def _queue_offset(self, p: QueuePosition) -> pb.GroupQueueOffset:
        return pb.GroupQueueOffset(
            topic=p.topic,
            queue_id=p.queue_id,
            committed_offset=p.committed,
            max_offset=p.max_offset,
            lag=p.lag,
            inflight=p.inflight,
            broker=self._broker_name,
        )

    def _group_status(self, config: SubscriptionGroupConfig) -> pb.GroupStatus:
        name = config.group_name
        positions = self._offsets.positions(name)
        now = time.monotonic()
        clients = [
            pb.GroupClient(
                client_id=s.client_id,
                client_type=_client_type_name(s.client_type),
                topics=sorted(s.topics),
                seconds_since_seen=round(now - s.last_seen, 1),
            )
            for s in self._clients.sessions()
            if s.group == name
        ]
        return pb.GroupStatus(
            group=pb.Group(
                name=name,
                fifo=config.consume_message_orderly,
                max_attempts=config.retry_max_times + 1,
                consume_enable=config.consume_enable,
            ),
            offsets=[self._queue_offset(p) for p in positions],
            clients=clients,
            total_lag=sum(p.lag for p in positions),
            members=members_report(self._members, name),
            brokers=[self._broker_name],
        )

    async def CreateGroup(self, request: pb.Group, context: Any) -> pb.GroupReply:
        if self._store.subscription_groups.get(request.name) is not None:
            await abort(
                context, grpc.StatusCode.ALREADY_EXISTS, f"group {request.name!r} already exists"
            )
        request.consume_enable = True
        config = await self._group_config(request, context, None)
        self._store.subscription_groups.put(config)
        await self._replicated(context, f"group {request.name!r}")
        return pb.GroupReply(group=self._group_status(config))

    async def UpdateGroup(self, request: pb.Group, context: Any) -> pb.GroupReply:
        await require(context, name=request.name)
        existing = self._store.subscription_groups.get(request.name)
        if existing is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"group {request.name!r} not found")
        config = await self._group_config(request, context, existing)
        self._store.subscription_groups.put(config)
        await self._replicated(context, f"group {request.name!r}")
        return pb.GroupReply(group=self._group_status(config))

    async def DeleteGroup(self, request: pb.GroupRequest, context: Any) -> pb.DeleteReply:
        await require(context, name=request.name)
        if self._store.subscription_groups.get(request.name) is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"group {request.name!r} not found")
        deleted = self._store.subscription_groups.delete(request.name)
        self._store.consumer_offsets.remove_group(request.name)
        await self._replicated(context, f"deleting group {request.name!r}")
        return pb.DeleteReply(deleted=deleted)

    async def DescribeGroup(self, request: pb.GroupRequest, context: Any) -> pb.GroupReply:
        await require(context, name=request.name)
        config = self._store.subscription_groups.get(request.name)
        if config is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"group {request.name!r} not found")
        self._offsets.take_acks()
        return pb.GroupReply(group=self._group_status(config))

    async def ListGroups(self, request: pb.ListGroupsRequest, context: Any) -> pb.ListGroupsReply:
        groups = sorted(self._store.subscription_groups.all(), key=lambda g: g.group_name)
        self._offsets.take_acks()
        return pb.ListGroupsReply(groups=[self._group_status(g) for g in groups])

    async def DescribeBroker(self, request: pb.DescribeBrokerRequest, context: Any) -> Any:
        half, timers = self._backlog()
        return pb.BrokerBacklog(
            broker_name=self._broker_name,
            master=self._is_master(),
            unconsumed=self._offsets.unconsumed(),
            half_messages=half,
            timers_waiting=timers,
        )

    async def HandOver(self, request: pb.HandOverRequest, context: Any) -> Any:
        if self._hand_over is None or not self._is_master():
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "only a master under a controller hands its leadership over",
            )
        assert self._hand_over is not None
        changed, reason = await self._hand_over(request.successor_broker_id)
        return pb.HandOverReply(changed=changed, reason=reason)

    async def CompactTopic(self, request_iterator: Any, context: Any) -> Any:
        return await compact_topic(self._store, request_iterator, context)

    async def ResetOffset(self, request: pb.ResetOffsetRequest, context: Any) -> Any:
        await require(context, group=request.group, topic=request.topic)
        if self._store.subscription_groups.get(request.group) is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"group {request.group!r} not found")
        topic = self._store.topics.get(request.topic)
        if topic is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"topic {request.topic!r} not found")
        target = request.WhichOneof("target")
        if target is None:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "say where to: earliest, latest or a timestamp",
            )
        if target == "timestamp_ms":
            target = "timestamp"
        moved = self._offsets.reset(request.group, topic, ResetTarget(target, request.timestamp_ms))
        return pb.ResetOffsetReply(offsets=[self._queue_offset(p) for p in moved])

    # -- messages ----------------------------------------------------------------------

    async def GetMessage(self, request: pb.GetMessageRequest, context: Any) -> Any:
        await require(context, topic=request.topic)
        if self._store.topics.get(request.topic) is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"topic {request.topic!r} not found")
        limit = min(request.max_results or 32, _MAX_LOOKUP)
        by = request.WhichOneof("by")
        if by == "message_id":
            one = self._store.query_by_msg_id(request.topic, request.message_id)
            found = [one] if one is not None else []
        elif by == "key":
            found = self._store.query_by_key(request.topic, request.key, max_results=limit)
        else:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "give a message id or a key")
        if not found:
            await abort(context, grpc.StatusCode.NOT_FOUND, "no such message")
        return pb.GetMessageReply(messages=[_stored(m, self._broker_name) for m in found])

    # -- users and ACLs (user_admin.py) ----------------------------------------------------

    async def CreateUser(self, request: pb.User, context: Any) -> pb.UserReply:
        return await self._users.create(request, context)

    async def UpdateUser(self, request: pb.User, context: Any) -> pb.UserReply:
        return await self._users.update(request, context)

    async def DeleteUser(self, request: pb.UserRequest, context: Any) -> pb.DeleteReply:
        return await self._users.delete(request, context)

    async def GetUser(self, request: pb.UserRequest, context: Any) -> pb.UserReply:
        return await self._users.get(request, context)

    async def ListUsers(self, request: pb.ListUsersRequest, context: Any) -> pb.ListUsersReply:
        return await self._users.list(request, context)

    async def CreateAcl(self, request: pb.AclRequest, context: Any) -> pb.UserReply:
        return await self._users.create_acl(request, context)

    async def DeleteAcl(self, request: pb.DeleteAclRequest, context: Any) -> pb.UserReply:
        return await self._users.delete_acl(request, context)


def _stored(m: StoredMessage, broker: str) -> pb.StoredMessage:
    return pb.StoredMessage(
        topic=m.topic,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        message_id=m.msg_id or "",
        offset_message_id=m.offset_msg_id,
        tag=m.tags or "",
        keys=m.keys,
        properties=m.properties,
        body=m.body,
        born_timestamp_ms=m.born_timestamp_ms,
        store_timestamp_ms=m.store_timestamp_ms,
        reconsume_times=m.reconsume_times,
        commitlog_offset=m.phys_offset,
        broker=broker,
    )


_CLIENT_TYPES = {1: "PRODUCER", 2: "PUSH_CONSUMER", 3: "SIMPLE_CONSUMER", 4: "PULL_CONSUMER"}


def _client_type_name(value: int) -> str:
    return _CLIENT_TYPES.get(value, "UNKNOWN")
