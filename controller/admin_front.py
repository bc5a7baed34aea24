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
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc

from capstan.client.admin import AdminClient
from capstan.client.errors import ClientError
from capstan.client.queue_mapping_wire import mapping_to_wire
from capstan.common.grpc_abort import require
from capstan.common.grpc_services import answer_unimplemented
from capstan.common.queue_mapping import (
    MAX_LOGIC_QUEUES,
    MappingError,
    QueueMapping,
    begin_move,
    finish_move,
    new_mapping,
)
from capstan.controller.controller_service import PASSED_ON_KEYS
from capstan.controller.replica_manager import GroupView, ReplicaManager
from capstan.controller.route_front import route_candidates
from capstan.controller.static_topic_book import MappingMoved, StaticTopicBook
from capstan.security.peers import passed_on_behalf, peer_security
from capstan.v1 import admin_pb2 as pb
from capstan.v1 import admin_pb2_grpc as pb_grpc
from capstan.v1 import consumer_pb2 as cpb

CALL_TIMEOUT_S = 10.0
"""Each group's call when the caller set no deadline, in seconds."""

REPLY_MARGIN_S = 0.5
"""Kept back from the caller's deadline to answer with what each group said, in seconds."""

LOOKUP_RESULTS = 32
"""Messages GetMessage returns when the request names no `max_results` (a broker's default)."""

R = TypeVar("R")

NO_GROUPS = "no broker group has registered with this controller"


# Metadata of the transport, not of the caller. The forwarded mark is the brokers' (see
# broker/edge/forwarding.py): with it a slave would answer a change itself instead of passing
# it on to its master.
_NOT_PASSED = PASSED_ON_KEYS


@dataclass(frozen=True)
class GroupOutcome:
    """One broker group's answer to a call passed to it: the reply, or why it failed."""

    group: str
    reply: Any = None
    code: grpc.StatusCode | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.code is None

    def reason(self) -> str:
        return f"{self.group}: {self.code.name if self.code else 'OK'}: {self.detail}"


@dataclass(frozen=True)
class Refusal:
    code: grpc.StatusCode
    detail: str


# -- decisions over the groups' answers (pure) ---------------------------------------------


def change_refusal(what: str, outcomes: Sequence[GroupOutcome]) -> Refusal | None:
    """None when every group made the change `what`; otherwise the answer naming the
    groups that failed and why, and those that changed (and stay changed)."""
    if not outcomes:
        return Refusal(grpc.StatusCode.UNAVAILABLE, NO_GROUPS)
    failed = [o for o in outcomes if not o.ok]
    if not failed:
        return None
    reasons = "; ".join(o.reason() for o in failed)
    done = [o.group for o in outcomes if o.ok]
    codes = {o.code for o in failed}
    if not done and len(codes) == 1 and failed[0].code is not None:
        return Refusal(failed[0].code, f"{what} failed on every broker group ({reasons})")
    kept = f"; the change was made on {', '.join(done)} and stays" if done else ""
    return Refusal(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"{what} failed on {len(failed)} of {len(outcomes)} broker groups ({reasons}){kept}",
    )


def read_refusal(what: str, outcomes: Sequence[GroupOutcome], missing_ok: bool) -> Refusal | None:
    """None when every group answered (with `missing_ok`, NOT_FOUND counts as an answer);
    otherwise the first failure's code, naming every group that failed."""
    missing = grpc.StatusCode.NOT_FOUND if missing_ok else None
    failed = [o for o in outcomes if o.code is not None and o.code is not missing]
    if not failed or failed[0].code is None:
        return None
    reasons = "; ".join(o.reason() for o in failed)
    return Refusal(failed[0].code, f"{what} failed on a broker group ({reasons})")


def not_found(outcomes: Sequence[GroupOutcome]) -> Refusal:
    """The answer when no group has what was asked for, in the first group's words."""
    detail = outcomes[0].detail if outcomes else NO_GROUPS
    return Refusal(grpc.StatusCode.NOT_FOUND, f"{detail} (asked every broker group)")


def union_topics(replies: Sequence[pb.ListTopicsReply]) -> pb.ListTopicsReply:
    """Every group's entry of every topic, by topic name, then in the order given: the
    groups may hold a topic with different settings, and each has its own queues."""
    entries: list[pb.TopicStatus] = [status for reply in replies for status in reply.topics]
    entries.sort(key=lambda s: s.topic.name)
    return pb.ListTopicsReply(topics=entries)


def merge_topic(statuses: Sequence[pb.TopicStatus]) -> pb.TopicStatus:
    """One topic as several broker groups show it: the first one's settings, every group's
    queues (in the order given, each naming its group) and every group named."""
    return pb.TopicStatus(
        topic=statuses[0].topic,
        queues=[q for s in statuses for q in s.queues],
        system=statuses[0].system,
        brokers=[b for s in statuses for b in s.brokers],
    )


def merge_group(statuses: Sequence[pb.GroupStatus]) -> pb.GroupStatus:
    """One consumer group as several broker groups show it: the first one's settings, every
    group's queue offsets (in the order given, each naming its group) and lag, each client
    and member once, and every group named."""
    clients: dict[str, pb.GroupClient] = {}
    members: dict[str, cpb.Member] = {}
    for status in statuses:
        for client in status.clients:
            clients.setdefault(client.client_id, client)
        for member in status.members.members:
            members.setdefault(member.client_id, member)
    problems = [s.members.inconsistency for s in statuses if s.members.inconsistency]
    return pb.GroupStatus(
        group=statuses[0].group,
        offsets=[o for s in statuses for o in s.offsets],
        clients=list(clients.values()),
        total_lag=sum(s.total_lag for s in statuses),
        members=cpb.GroupMembers(
            group=statuses[0].members.group,
            members_version=max(s.members.members_version for s in statuses),
            members=[members[c] for c in sorted(members)],
            subscriptions_consistent=not problems,
            inconsistency=problems[0] if problems else "",
        ),
        brokers=[b for s in statuses for b in s.brokers],
    )


def union_groups(replies: Sequence[pb.ListGroupsReply]) -> pb.ListGroupsReply:
    """Every broker group's entry of every consumer group, by name, then in the order given:
    lag and clients are each broker group's own."""
    entries: list[pb.GroupStatus] = [status for reply in replies for status in reply.groups]
    entries.sort(key=lambda s: s.group.name)
    return pb.ListGroupsReply(groups=entries)


def union_users(replies: Sequence[pb.ListUsersReply]) -> pb.ListUsersReply:
    """Each user once, as the first group that has it describes it."""
    seen: dict[str, pb.User] = {}
    for reply in replies:
        for user in reply.users:
            seen.setdefault(user.username, user)
    return pb.ListUsersReply(users=[seen[name] for name in sorted(seen)])


def lookup_refusal(
    request: pb.GetMessageRequest, outcomes: Sequence[GroupOutcome], found: bool
) -> Refusal | None:
    """Whether GetMessage must fail: a message found by id is the whole answer (an id is
    stored once), whereas by key a group that failed may hold more of them."""
    if found and request.WhichOneof("by") == "message_id":
        return None
    refusal = read_refusal("GetMessage", outcomes, True)
    if refusal is None and not found:
        return not_found(outcomes)
    return refusal


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
        self._book = book
        self._moves = asyncio.Lock()
        """One move at a time on this controller (the book's compare-and-swap guards
        against other controller replicas)."""
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
        return await self._change(context, "UpdateTopic", request, _topic_reply)

    async def DeleteTopic(self, request: pb.TopicRequest, context: Any) -> pb.DeleteReply:
        """On every group; a static topic on its groups, and out of the book once they all
        deleted it."""
        held = await asyncio.to_thread(self._book.get, request.name) if request.name else None
        groups = None if held is None else held.groups()
        outcomes = await self._fan_out(context, "DeleteTopic", request, groups)
        await _refuse_if(context, change_refusal(f"DeleteTopic {request.name!r}", outcomes))
        if held is not None:
            await asyncio.to_thread(self._book.delete, request.name)
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

    # -- static topics -----------------------------------------------------------------

    async def CreateStaticTopic(
        self, request: pb.StaticTopicRequest, context: Any
    ) -> pb.QueueMappingReply:
        """Decide the mapping, record it, then hand it to every group of the topic. A call
        repeated after a partial failure hands the same mapping on again."""
        await self._require_leader(context)
        mapping = await self._new_mapping(request, context)
        name = mapping.topic
        held = await asyncio.to_thread(self._book.get, name)
        if held is not None and held != mapping:
            await _abort(
                context,
                Refusal(
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"static topic {name!r} exists (epoch {held.epoch}, groups "
                    f"{', '.join(held.groups())})",
                ),
            )
        if held is None:
            await self._refuse_a_normal_topic(context, name)
            await asyncio.to_thread(self._book.put, mapping, None)
        given = pb.SetQueueMappingRequest(topic=request.topic, mapping=mapping_to_wire(mapping))
        outcomes = await self._fan_out(context, "SetQueueMapping", given, mapping.groups())
        refusal = change_refusal(f"CreateStaticTopic {name!r}", outcomes)
        if refusal is not None and all(
            o.code is grpc.StatusCode.INVALID_ARGUMENT for o in outcomes
        ):  # no group took it: the topic was never made
            await asyncio.to_thread(self._book.delete, name)
        await _refuse_if(context, refusal)
        return pb.QueueMappingReply(
            mapping=mapping_to_wire(mapping),
            topic=merge_topic([o.reply.topic for o in outcomes]),
        )

    async def GetQueueMapping(
        self, request: pb.QueueMappingRequest, context: Any
    ) -> pb.QueueMappingReply:
        await require(context, topic=request.topic)
        await self._require_leader(context)
        held = await asyncio.to_thread(self._book.get, request.topic)
        if held is None:
            await _abort(
                context, Refusal(grpc.StatusCode.NOT_FOUND, f"no static topic {request.topic!r}")
            )
        return pb.QueueMappingReply(mapping=mapping_to_wire(held))

    async def RemapStaticQueue(self, request: pb.RemapRequest, context: Any) -> Any:
        """Move a logic queue's writes to `group`: seal it (recorded, then handed to its
        group, whose answer says where the queue stopped), then open it on `group` at the
        next logic offset (recorded, then handed to every group of the topic). Each step is
        in the book before any broker acts on it, so a crash leaves the old mapping, the
        sealed one (asking again finishes the move) or the new one, never a mix."""
        await require(context, topic=request.topic, group=request.group)
        await self._require_leader(context)
        held = await asyncio.to_thread(self._book.get, request.topic)
        registered = await asyncio.to_thread(self._manager.group_names)
        problem = None
        if held is None:
            problem = Refusal(grpc.StatusCode.NOT_FOUND, f"no static topic {request.topic!r}")
        elif not 0 <= request.queue_id < held.total_queues:
            problem = Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"static topic {request.topic!r} has no logic queue {request.queue_id} "
                f"(0..{held.total_queues - 1})",
            )
        elif request.group not in registered:
            problem = Refusal(
                grpc.StatusCode.NOT_FOUND,
                f"broker group {request.group!r} is not registered with this controller "
                f"(registered: {', '.join(registered) or 'none'})",
            )
        await _refuse_if(context, problem)
        assert held is not None
        async with self._moves:
            moved = await self._move(context, held, request.queue_id, request.group)
        return pb.QueueMappingReply(mapping=mapping_to_wire(moved))

    async def _move(self, context: Any, held: QueueMapping, queue: int, to: str) -> QueueMapping:
        try:
            begun = begin_move(held, queue, to)
        except MappingError as exc:
            await _abort(context, Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(exc)))
        config = await self._static_config(context, held)
        if to not in held.groups():  # before anything is recorded: can `to` take it?
            await self._refuse_a_normal_topic(context, held.topic, [to])
        if begun is not held:
            await self._record(context, begun, held.epoch)
        leader = begun.leader(queue)
        if leader.takes_writes:  # already there: make sure every group holds it
            await self._hand_over(context, config, begun, begun.groups())
            return begun
        sealed = begun.items(queue)[-2]
        old_end = await self._queue_end(context, config, begun, sealed.group, queue)
        new_start = await self._queue_end(context, config, begun, leader.group, queue)
        done = finish_move(begun, queue, old_end, new_start)
        await self._record(context, done, begun.epoch)
        await self._hand_over(context, config, done, done.groups())
        return done

    async def _static_config(self, context: Any, mapping: QueueMapping) -> pb.Topic:
        """The static topic's config (type, perm, attributes) as its groups hold it."""
        request = pb.TopicRequest(name=mapping.topic)
        outcomes = await self._fan_out(context, "DescribeTopic", request, mapping.groups())
        found = [o.reply.topic.topic for o in outcomes if o.ok]
        if not found:
            await _refuse_if(
                context, read_refusal(f"DescribeTopic {mapping.topic!r}", outcomes, True)
            )
            await _abort(context, not_found(outcomes))
        config = pb.Topic()
        config.CopyFrom(found[0])
        config.read_queue_nums = config.write_queue_nums = mapping.total_queues
        return config

    async def _record(self, context: Any, mapping: QueueMapping, decided_from: int) -> None:
        try:
            await asyncio.to_thread(self._book.put, mapping, decided_from)
        except MappingMoved as exc:
            await _abort(context, Refusal(grpc.StatusCode.ABORTED, str(exc)))

    async def _queue_end(
        self, context: Any, config: pb.Topic, mapping: QueueMapping, group: str, queue: int
    ) -> int:
        """Hand `mapping` to `group`; where its physical queue `queue` ends once it holds it
        (a group sealed by it takes no more writes there)."""
        given = pb.SetQueueMappingRequest(topic=config, mapping=mapping_to_wire(mapping))
        (outcome,) = await self._fan_out(context, "SetQueueMapping", given, [group])
        await _refuse_if(context, change_refusal(f"SetQueueMapping {mapping.topic!r}", [outcome]))
        ends = [q.max_offset for q in outcome.reply.topic.queues if q.queue_id == queue]
        return ends[0] if ends else 0

    async def _hand_over(
        self, context: Any, config: pb.Topic, mapping: QueueMapping, groups: Sequence[str]
    ) -> None:
        given = pb.SetQueueMappingRequest(topic=config, mapping=mapping_to_wire(mapping))
        outcomes = await self._fan_out(context, "SetQueueMapping", given, groups)
        await _refuse_if(context, change_refusal(f"SetQueueMapping {mapping.topic!r}", outcomes))

    async def _new_mapping(self, request: pb.StaticTopicRequest, context: Any) -> QueueMapping:
        topic = request.topic
        total = topic.write_queue_nums or topic.read_queue_nums
        registered = await asyncio.to_thread(self._manager.group_names)
        groups = list(request.groups) or registered
        unknown = [g for g in groups if g not in registered]
        problem = None
        if not topic.name:
            problem = Refusal(grpc.StatusCode.INVALID_ARGUMENT, "a static topic needs a name")
        elif not 1 <= total <= MAX_LOGIC_QUEUES:
            problem = Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a static topic needs 1..{MAX_LOGIC_QUEUES} logic queues (write_queue_nums), "
                f"got {total}",
            )
        elif unknown:
            problem = Refusal(
                grpc.StatusCode.NOT_FOUND,
                f"broker group {unknown[0]!r} is not registered with this controller "
                f"(registered: {', '.join(registered) or 'none'})",
            )
        elif not groups:
            problem = Refusal(grpc.StatusCode.UNAVAILABLE, NO_GROUPS)
        await _refuse_if(context, problem)
        try:
            return new_mapping(topic.name, total, groups)
        except MappingError as exc:
            await _abort(context, Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)))

    async def _refuse_a_normal_topic(
        self, context: Any, name: str, groups: Sequence[str] | None = None
    ) -> None:
        """A static topic's name found on a group it is not on yet is a normal topic's."""
        request = pb.TopicRequest(name=name)
        outcomes = await self._fan_out(context, "DescribeTopic", request, groups)
        await _refuse_if(context, read_refusal(f"DescribeTopic {name!r}", outcomes, True))
        found = [o.group for o in outcomes if o.ok]
        if found:
            await _abort(
                context,
                Refusal(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"topic {name!r} exists as a normal topic on {', '.join(found)}; "
                    "a static topic needs a name of its own",
                ),
            )

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
    ) -> R:
        """`method` on every group; when all made the change, their replies combined.
        `name` names what changed (default: the request's `name`)."""
        outcomes = await self._fan_out(context, method, request)
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
        group-name order."""
        await self._require_leader(context)
        views = await asyncio.to_thread(self._views)
        if groups is not None:
            views = [v for v in views if v.info.group in groups]
        if not views:
            await _abort(context, Refusal(grpc.StatusCode.UNAVAILABLE, NO_GROUPS))
        metadata = _passed_metadata(context)
        timeout_s = _timeout_s(context)
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
