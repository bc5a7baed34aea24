"""capstan.v1.Admin on the controller: topic and consumer-group calls passed to every broker
group, as RocketMQ's `mqadmin updateTopic -c <cluster>` does, so that one command against
the controller's address makes a topic (or a consumer group) exist on all of them.

Each group is asked through its replicas in route order (the master first), with the SDK's
admin client (client/admin.py); a replica that cannot be reached is skipped, and one that
is not the master passes the call on to it. The caller's metadata goes along and its
deadline bounds every group's call.

- Changes (Create/Update/Delete of topics and groups) go to every group at once. The answer
  is OK only when every group made the change (and shows every group's queues and offsets,
  as a describe does); otherwise it names each failed group with its reason and the groups
  that did change, which keep the change (nothing is undone).
  Every group failing for the same reason answers with that reason's code (ALREADY_EXISTS,
  NOT_FOUND, UNAVAILABLE, ...); anything else, a partial change above all, is
  FAILED_PRECONDITION: the groups now differ, and repeating the call will not simply fix it.
- Reads combine every group, and each row names its group (the brokers fill in `broker`):
  ListTopics and ListGroups give one entry per group that has the topic or consumer group,
  DescribeTopic and DescribeGroup one status with every group's queues. They fail when any
  group fails, naming it, rather than answer with a part missing. GetMessage by key does
  the same; by message id, a message found is the answer (an id is stored once), and only
  when none is found does a group that failed make the call fail.
- ResetOffset is UNIMPLEMENTED: a reset names queues by id, and each group has its own
  queues with the same ids, so the refusal lists every group's master to reset on instead.

Only the leading controller answers (the others hear no heartbeats, so they cannot tell
which replicas are alive): a follower refuses with FAILED_PRECONDITION.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import grpc

from capstan.client.admin import AdminClient
from capstan.client.errors import ClientError
from capstan.client.queue_mapping_wire import mapping_to_wire
from capstan.common.grpc_abort import require
from capstan.common.grpc_services import answer_unimplemented
from capstan.controller.controller_service import PASSED_ON_KEYS
from capstan.controller.group_answers import (
    NO_GROUPS,
    GroupOutcome,
    Refusal,
    Refused,
    change_refusal,
    lookup_refusal,
    merge_group,
    merge_topic,
    not_found,
    read_refusal,
    union_groups,
    union_topics,
    union_users,
)
from capstan.controller.replica_manager import GroupView, ReplicaManager
from capstan.controller.route_front import route_candidates
from capstan.controller.static_topic_book import StaticTopicBook
from capstan.controller.static_topics import Ask, StaticTopics
from capstan.security.peers import passed_on_behalf, peer_security
from capstan.v1 import admin_pb2 as pb
from capstan.v1 import admin_pb2_grpc as pb_grpc

CALL_TIMEOUT_S = 10.0
"""Each group's call when the caller set no deadline, in seconds."""

REPLY_MARGIN_S = 0.5
"""Kept back from the caller's deadline to answer with what each group said, in seconds."""

LOOKUP_RESULTS = 32
"""Messages GetMessage returns when the request names no `max_results` (a broker's default)."""

R = TypeVar("R")

# Metadata of the transport, not of the caller. The forwarded mark is the brokers' (see
# broker/edge/forwarding.py): with it a slave would answer a change itself instead of passing
# it on to its master.
_NOT_PASSED = PASSED_ON_KEYS


# -- the service ---------------------------------------------------------------------------


# Every Admin RPC is served today; one added to admin.proto is refused cleanly until it is.
@answer_unimplemented("the Capstan controller")
class AdminFront(pb_grpc.AdminServicer):
    def __init__(
        self,
        manager: ReplicaManager,
        controller_id: str,
        leading: Callable[[], bool],
        book: StaticTopicBook,
    ) -> None:
        self._manager = manager
        self._static = StaticTopics(book, manager.group_names)
        self._controller_id = controller_id
        self._leading = leading
        self._clients: dict[str, AdminClient] = {}

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    # -- topics ------------------------------------------------------------------------

    async def CreateTopic(self, request: pb.Topic, context: Any) -> pb.TopicReply:
        return await self._change(context, "CreateTopic", request, _topic_reply)

    async def UpdateTopic(self, request: pb.Topic, context: Any) -> pb.TopicReply:
        """On every group; a static topic on its groups (its queue count is fixed)."""
        groups = await self._static_groups(request.name)
        return await self._change(context, "UpdateTopic", request, _topic_reply, groups=groups)

    async def DeleteTopic(self, request: pb.TopicRequest, context: Any) -> pb.DeleteReply:
        """On every group; a static topic on its groups, and out of the book once they all
        deleted it."""
        groups = await self._static_groups(request.name)
        outcomes = await self._fan_out(context, "DeleteTopic", request, groups)
        await _refuse_if(context, change_refusal(f"DeleteTopic {request.name!r}", outcomes))
        if groups is not None:
            await asyncio.to_thread(self._static.book.delete, request.name)
        reply: pb.DeleteReply = outcomes[0].reply
        return reply

    async def DescribeTopic(self, request: pb.TopicRequest, context: Any) -> pb.TopicReply:
        outcomes = await self._fan_out(context, "DescribeTopic", request)
        await _refuse_if(context, read_refusal(f"DescribeTopic {request.name!r}", outcomes, True))
        found = [o.reply.topic for o in outcomes if o.ok]
        if not found:
            await _abort(context, not_found(outcomes))
        return pb.TopicReply(topic=merge_topic(found))

    async def ListTopics(self, request: pb.ListTopicsRequest, context: Any) -> pb.ListTopicsReply:
        outcomes = await self._fan_out(context, "ListTopics", request)
        await _refuse_if(context, read_refusal("ListTopics", outcomes, False))
        return union_topics([o.reply for o in outcomes])

    async def _static_groups(self, topic: str) -> list[str] | None:
        """The groups of static topic `topic`; None for a topic that is not static."""
        held = await asyncio.to_thread(self._static.book.get, topic) if topic else None
        return None if held is None else held.groups()

    # -- static topics (static_topics.py) ---------------------------------------------

    async def CreateStaticTopic(
        self, request: pb.StaticTopicRequest, context: Any
    ) -> pb.QueueMappingReply:
        await self._require_leader(context)
        try:
            mapping, outcomes = await self._static.create(
                self._asker(context), request.topic, list(request.groups)
            )
        except Refused as exc:
            await _abort(context, exc.refusal)
        return pb.QueueMappingReply(
            mapping=mapping_to_wire(mapping),
            topic=merge_topic([o.reply.topic for o in outcomes]),
        )

    async def RemapStaticQueue(self, request: pb.RemapRequest, context: Any) -> Any:
        await require(context, topic=request.topic, group=request.group)
        await self._require_leader(context)
        try:
            moved = await self._static.remap(
                self._asker(context), request.topic, request.queue_id, request.group
            )
        except Refused as exc:
            await _abort(context, exc.refusal)
        return pb.QueueMappingReply(mapping=mapping_to_wire(moved))

    async def RetireStaticGroup(self, request: pb.RemapRequest, context: Any) -> Any:
        await require(context, topic=request.topic, group=request.group)
        await self._require_leader(context)
        try:  # as the cluster: the retired group may be gone, and that is no failure
            retired = await self._static.retire(self._own_asker(), request.topic, request.group)
        except Refused as exc:
            await _abort(context, exc.refusal)
        return pb.QueueMappingReply(mapping=mapping_to_wire(retired))

    async def GetQueueMapping(
        self, request: pb.QueueMappingRequest, context: Any
    ) -> pb.QueueMappingReply:
        await require(context, topic=request.topic)
        await self._require_leader(context)
        held = await asyncio.to_thread(self._static.book.get, request.topic)
        if held is None:
            await _abort(
                context, Refusal(grpc.StatusCode.NOT_FOUND, f"no static topic {request.topic!r}")
            )
        return pb.QueueMappingReply(mapping=mapping_to_wire(held))

    async def keep_static_topics(self) -> None:
        """Bring every static topic's groups in step with the book (static_topics.py),
        calling them as the cluster itself."""
        await self._static.keep(self._own_asker())

    # -- consumer groups ---------------------------------------------------------------

    async def CreateGroup(self, request: pb.Group, context: Any) -> pb.GroupReply:
        return await self._change(context, "CreateGroup", request, _group_reply)

    async def UpdateGroup(self, request: pb.Group, context: Any) -> pb.GroupReply:
        return await self._change(context, "UpdateGroup", request, _group_reply)

    async def DeleteGroup(self, request: pb.GroupRequest, context: Any) -> pb.DeleteReply:
        return await self._change(context, "DeleteGroup", request, _first_reply)

    async def DescribeGroup(self, request: pb.GroupRequest, context: Any) -> pb.GroupReply:
        outcomes = await self._fan_out(context, "DescribeGroup", request)
        await _refuse_if(context, read_refusal(f"DescribeGroup {request.name!r}", outcomes, True))
        found = [o.reply.group for o in outcomes if o.ok]
        if not found:
            await _abort(context, not_found(outcomes))
        return pb.GroupReply(group=merge_group(found))

    async def ListGroups(self, request: pb.ListGroupsRequest, context: Any) -> pb.ListGroupsReply:
        outcomes = await self._fan_out(context, "ListGroups", request)
        await _refuse_if(context, read_refusal("ListGroups", outcomes, False))
        return union_groups([o.reply for o in outcomes])

    async def ResetOffset(self, request: pb.ResetOffsetRequest, context: Any) -> Any:
        await self._require_leader(context)
        views = await asyncio.to_thread(self._views)
        masters = ", ".join(f"{v.info.group} at {v.master_address or '(no master)'}" for v in views)
        await _abort(
            context,
            Refusal(
                grpc.StatusCode.UNIMPLEMENTED,
                "the controller does not reset offsets: each broker group has its own queues; "
                f"reset them on each group's master instead ({masters or NO_GROUPS})",
            ),
        )

    # -- messages ----------------------------------------------------------------------

    async def GetMessage(self, request: pb.GetMessageRequest, context: Any) -> Any:
        outcomes = await self._fan_out(context, "GetMessage", request)
        found = [m for o in outcomes if o.ok for m in o.reply.messages]
        await _refuse_if(context, lookup_refusal(request, outcomes, bool(found)))
        return pb.GetMessageReply(messages=found[: request.max_results or LOOKUP_RESULTS])

    # -- users and ACLs: every group keeps its own copy ---------------------------------

    async def CreateUser(self, request: pb.User, context: Any) -> pb.UserReply:
        return await self._change(context, "CreateUser", request, _first_reply, request.username)

    async def UpdateUser(self, request: pb.User, context: Any) -> pb.UserReply:
        return await self._change(context, "UpdateUser", request, _first_reply, request.username)

    async def DeleteUser(self, request: pb.UserRequest, context: Any) -> pb.DeleteReply:
        return await self._change(context, "DeleteUser", request, _first_reply, request.username)

    async def CreateAcl(self, request: pb.AclRequest, context: Any) -> pb.UserReply:
        return await self._change(context, "CreateAcl", request, _first_reply, request.username)

    async def DeleteAcl(self, request: pb.DeleteAclRequest, context: Any) -> pb.UserReply:
        return await self._change(context, "DeleteAcl", request, _first_reply, request.username)

    async def GetUser(self, request: pb.UserRequest, context: Any) -> pb.UserReply:
        outcomes = await self._fan_out(context, "GetUser", request)
        await _refuse_if(context, read_refusal(f"GetUser {request.username!r}", outcomes, False))
        reply: pb.UserReply = outcomes[0].reply
        return reply

    async def ListUsers(self, request: pb.ListUsersRequest, context: Any) -> pb.ListUsersReply:
        outcomes = await self._fan_out(context, "ListUsers", request)
        await _refuse_if(context, read_refusal("ListUsers", outcomes, False))
        return union_users([o.reply for o in outcomes])

    # -- plumbing ----------------------------------------------------------------------

    async def _change(
        self,
        context: Any,
        method: str,
        request: Any,
        combine: Callable[[list[Any]], R],
        name: str | None = None,
        groups: Sequence[str] | None = None,
    ) -> R:
        """`method` on every group (or on `groups`); when all made the change, their replies
        combined. `name` names what changed (default: the request's `name`)."""
        outcomes = await self._fan_out(context, method, request, groups)
        label = request.name if name is None else name
        await _refuse_if(context, change_refusal(f"{method} {label!r}", outcomes))
        return combine([o.reply for o in outcomes])

    async def _require_leader(self, context: Any) -> None:
        if not self._leading():
            await _abort(
                context,
                Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"controller {self._controller_id} is not the leader",
                ),
            )

    def _views(self) -> list[GroupView]:
        return [self._manager.view(g) for g in self._manager.group_names()]

    async def _fan_out(
        self, context: Any, method: str, request: Any, groups: Sequence[str] | None = None
    ) -> list[GroupOutcome]:
        """`method` on every group (or those of `groups`) at once, each outcome in
        group-name order, with the caller's signature and deadline."""
        await self._require_leader(context)
        outcomes = await self._ask_groups(
            method, request, groups, _passed_metadata(context), _timeout_s(context)
        )
        if not outcomes:
            await _abort(context, Refusal(grpc.StatusCode.UNAVAILABLE, NO_GROUPS))
        return outcomes

    def _asker(self, context: Any) -> Ask:
        def ask(method: str, request: Any, groups: Sequence[str] | None) -> Any:
            return self._fan_out(context, method, request, groups)

        return ask

    def _own_asker(self) -> Ask:
        """Calls the controller makes itself: signed as the cluster, CALL_TIMEOUT_S each."""

        def ask(method: str, request: Any, groups: Sequence[str] | None) -> Any:
            metadata = peer_security().signature()
            return self._ask_groups(method, request, groups, metadata, CALL_TIMEOUT_S)

        return ask

    async def _ask_groups(
        self,
        method: str,
        request: Any,
        groups: Sequence[str] | None,
        metadata: list[tuple[str, str]],
        timeout_s: float,
    ) -> list[GroupOutcome]:
        views = await asyncio.to_thread(self._views)
        if groups is not None:
            views = [v for v in views if v.info.group in groups]
        asked = (self._ask_group(v, method, request, metadata, timeout_s) for v in views)
        return list(await asyncio.gather(*asked))

    async def _ask_group(
        self,
        view: GroupView,
        method: str,
        request: Any,
        metadata: list[tuple[str, str]],
        timeout_s: float,
    ) -> GroupOutcome:
        """The group's answer from the first replica that can be reached. Only UNAVAILABLE
        moves on to the next: any other failure (a timeout above all) may have come after a
        change was made, and is the group's answer."""
        group = view.info.group
        unreachable = []
        for address in route_candidates(view):
            try:
                reply = await self._client(address).call(
                    method, request, metadata=metadata, timeout_s=timeout_s
                )
            except ClientError as exc:
                if exc.code != "UNAVAILABLE":
                    code = grpc.StatusCode.__members__.get(exc.code, grpc.StatusCode.UNKNOWN)
                    return GroupOutcome(group, code=code, detail=exc.detail)
                unreachable.append(f"{address}: {exc.detail}")
                continue
            return GroupOutcome(group, reply)
        detail = (
            f"no replica of group {group} could be reached ({'; '.join(unreachable)})"
            if unreachable
            else f"group {group} has no live replica"
        )
        return GroupOutcome(group, code=grpc.StatusCode.UNAVAILABLE, detail=detail)

    def _client(self, address: str) -> AdminClient:
        """The replica's admin client: no retries (the next replica is the retry)."""
        client = self._clients.get(address)
        if client is None:
            # The caller's signature goes along (passed metadata); TLS as this process's.
            ca = peer_security().ca_file
            client = self._clients[address] = AdminClient(address, retry_s=0, ca_file=ca)
        return client


def _topic_reply(replies: list[pb.TopicReply]) -> pb.TopicReply:
    return pb.TopicReply(topic=merge_topic([r.topic for r in replies]))


def _group_reply(replies: list[pb.GroupReply]) -> pb.GroupReply:
    return pb.GroupReply(group=merge_group([r.group for r in replies]))


def _first_reply(replies: list[R]) -> R:
    return replies[0]


def _passed_metadata(context: Any) -> list[tuple[str, str]]:
    return passed_on_behalf(context, _NOT_PASSED)


def _timeout_s(context: Any) -> float:
    remaining = context.time_remaining()
    if remaining is None:
        return CALL_TIMEOUT_S
    return max(0.1, float(remaining) - REPLY_MARGIN_S)


async def _refuse_if(context: Any, refusal: Refusal | None) -> None:
    if refusal is not None:
        await _abort(context, refusal)


async def _abort(context: Any, refusal: Refusal) -> NoReturn:
    await context.abort(refusal.code, refusal.detail)
    raise AssertionError("abort returned")  # pragma: no cover
